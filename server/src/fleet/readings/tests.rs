//! The readings the machine page charts, on a real SQLite file.

use crate::inventory::GpuLive;
use crate::testing::{majin_and_node, TestApp};
use placement::Bytes;

fn live(index: u32, utilisation: u32) -> GpuLive {
    GpuLive {
        index,
        utilisation_percent: utilisation,
        power_mw: Some(120_000),
        temperature_c: Some(51),
        energy_mj: None,
        used: Bytes::gb(3),
        processes: Vec::new(),
        problem: None,
    }
}

#[tokio::test]
async fn a_gpus_readings_come_back_oldest_first_with_what_is_held_outside_and_thinned_for_a_chart()
{
    let app = TestApp::new(&majin_and_node()).await;
    let majin = app
        .fleet
        .committed_inventory()
        .await
        .machine("majin")
        .cloned()
        .unwrap();
    for i in 0..500u64 {
        app.fleet
            .record_samples(&majin, &[live(0, (i % 100) as u32)], 1_000_000 + i * 5_000)
            .await
            .unwrap();
    }
    let history = app
        .fleet
        .gpu_history("majin", 1_000_000 + 10 * 5_000)
        .await
        .unwrap();
    let points = &history[&0];
    assert!(points.len() <= 240, "{}", points.len());
    assert_eq!(
        points.first().unwrap().at_ms,
        1_050_000,
        "the oldest since then"
    );
    assert_eq!(
        points.last().unwrap().at_ms,
        1_000_000 + 499 * 5_000,
        "the newest"
    );
    assert!(points.windows(2).all(|w| w[0].at_ms < w[1].at_ms));
    let newest = points.last().unwrap();
    assert_eq!(newest.utilisation_percent, 99);
    assert_eq!(newest.used, Some(Bytes::gb(3)));
    assert_eq!(newest.held_outside, Some(majin.gpus[0].held_outside));
    assert_eq!(
        (newest.temperature_c, newest.power_mw),
        (Some(51), Some(120_000))
    );
    assert!(app.fleet.gpu_history("node", 0).await.unwrap().is_empty());
}
