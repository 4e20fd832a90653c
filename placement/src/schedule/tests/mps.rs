//! GPUs that run MPS: at most 48 engines each, and each engine on that one GPU.

use super::*;
use crate::sharing::MPS_MAX_CLIENTS;
use crate::testing::machine;

#[test]
fn an_mps_gpu_takes_its_48th_engine_and_turns_the_49th_to_a_time_sliced_gpu() {
    let mut s = fleet(vec![machine("node", &[80, 80])]);
    s.set_sharing(&GpuRef::new("node", 0), Sharing::Mps);
    assert_eq!(s.sharing(&GpuRef::new("node", 0)), Sharing::Mps);
    assert_eq!(s.sharing(&GpuRef::new("node", 1)), Sharing::TimeSlicing);
    // Fill GPU 0 first: it is the fuller once it holds something.
    placed(s.place("big", &shared(20.0)));
    for i in 1..MPS_MAX_CLIENTS {
        let a = placed(s.place(&format!("e{i}"), &shared(0.5)));
        assert_eq!(a.gpus, [0], "engine {i}");
    }
    let next = placed(s.place("e48", &shared(0.5)));
    assert_eq!(next.gpus, [1], "the 49th goes where time-slicing takes it");
    let pinned = request(
        r#"{"gpu_requests": {"count": 1, "shared": true, "memory_gb": 1, "ids": ["node:0"]}}"#,
    );
    assert_eq!(
        waits(s.place("pinned", &pinned)),
        ["GPU 0 of node runs MPS, whose server takes at most 48 engines, and has that many"]
    );
}

#[test]
fn an_engine_on_several_gpus_does_not_take_an_mps_gpu() {
    let mut s = fleet(vec![machine("node", &[24, 24])]);
    s.set_sharing(&GpuRef::new("node", 1), Sharing::Mps);
    let two = request(r#"{"gpu_requests": {"count": 2, "shared": true, "memory_gb": 4}}"#);
    let reasons = waits(s.place("tp", &two));
    assert!(
        reasons.contains(
            &"GPU 1 of node runs MPS, where each engine runs on that one GPU; it needs several"
                .to_owned()
        ),
        "{reasons:?}"
    );
    // One GPU is fine, and a committed hold is checked the same way.
    assert_eq!(placed(s.place("one", &shared(4.0))).gpus.len(), 1);
    assert!(matches!(
        s.hold_for(
            "tp",
            Assignment {
                gpus: vec![0, 1],
                ..shared_on("node", 1, 1.0)
            }
        ),
        Err(ScheduleError::DoesNotFit(PendingReason::MpsOneGpu { .. }))
    ));
}
