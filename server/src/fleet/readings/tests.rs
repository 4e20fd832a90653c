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

/// The seed 000 gap made visible: on a time-sliced GPU a share is a promise, and an engine measured past it
/// is named where an operator looks (the machine page, the Models tab) and counted in `/metrics`.
#[tokio::test]
async fn an_engine_measured_past_its_share_is_flagged_on_its_machine_page_the_models_tab_and_in_metrics_until_it_keeps_it(
) {
    let app = crate::testing::majin_and_atlas_with_catalog().await;
    let (status, body) = app
        .deploy(serde_json::json!({"model": "speech", "gpus": ["atlas:0"], "share": 10}))
        .await;
    assert_eq!(status, axum::http::StatusCode::CREATED, "{body}");
    let (status, _) = app
        .post_worker(&crate::testing::shared_worker("voice", 4.2))
        .await;
    assert_eq!(status, axum::http::StatusCode::CREATED);
    let (_, voice) = app.get("/api/workers/voice").await;
    assert_eq!(
        (&voice["machine"], &voice["gpus"]),
        (&serde_json::json!("majin"), &serde_json::json!([0]))
    );
    let running = vec![
        ("voice".to_owned(), vec![4242]),
        ("group:speech/speech@atlas".to_owned(), vec![777]),
    ];
    let measure = |voice_gb: f64, speech_gb: f64| {
        let mut majin0 = live(0, 10);
        majin0.processes = vec![(4242, Bytes::from_gb(voice_gb).unwrap())];
        let mut atlas0 = live(0, 10);
        atlas0.processes = vec![(777, Bytes::from_gb(speech_gb).unwrap())];
        app.fleet.measure("majin", &[majin0], &running, &[]);
        app.fleet.measure("atlas", &[atlas0], &running, &[]);
    };
    let html = |page: serde_json::Value| page.as_str().unwrap().to_owned();
    let over = |metrics: &str, worker: &str, flag: &str| {
        metrics.lines().any(|l| {
            l.starts_with("tessera_worker_over_share{")
                && l.contains(&format!("worker=\"{worker}\""))
                && l.ends_with(flag)
        })
    };

    // 10 % of a 96 GB GPU is 9.6 GB: speech takes 11; voice takes 5.5 of its 4.2 GB.
    measure(5.5, 11.0);
    let (_, machine) = app.get("/api/machines/majin").await;
    let sharer = &machine["gpus"][0]["sharers"][0];
    assert_eq!(
        sharer["over_share"],
        "voice uses 5.5 GB on GPU 0 of majin, 1.3 GB past its 4.2 GB share: its neighbours may run out of memory."
    );
    assert_eq!(sharer["measured_bytes"], Bytes::from_gb(5.5).unwrap().get());
    let machine_page = html(app.get("/machines/majin").await.1);
    assert!(machine_page.contains("1.3 GB past its 4.2 GB share"));
    assert!(machine_page
        .contains("Time-sliced: each share is a promise the engine keeps by sizing itself."));
    let models = html(app.get("/models").await.1);
    assert!(
        models.contains("speech uses 11 GB on GPU 0 of atlas, 1.4 GB past its 9.6 GB share"),
        "the Models tab names it"
    );
    let metrics = html(app.get("/metrics").await.1);
    assert!(over(&metrics, "voice", " 1"), "{metrics}");
    assert!(over(&metrics, "speech", " 1"));

    // Back within their shares at the next reading, the flags go.
    measure(4.0, 9.0);
    assert_eq!(app.fleet.over_shares().get("voice"), None);
    assert_eq!(app.fleet.over_shares().get("speech"), None);
    let metrics = html(app.get("/metrics").await.1);
    assert!(
        !over(&metrics, "voice", ""),
        "within its share, a sharer has no series: {metrics}"
    );
    assert!(!over(&metrics, "speech", ""));
}

#[tokio::test]
async fn why_a_reading_found_a_gpu_unhealthy_is_on_its_machine_page_until_a_reading_finds_it_well()
{
    let app = TestApp::new(&majin_and_node()).await;
    let lost = GpuLive {
        problem: Some("NVML could not report its memory (GPU is lost)".into()),
        ..live(1, 0)
    };
    app.fleet.measure("node", &[live(0, 5), lost], &[], &[]);
    let (_, node) = app.get("/api/machines/node").await;
    assert_eq!(node["gpus"][0].get("problem"), None);
    assert_eq!(
        node["gpus"][1]["problem"],
        "NVML could not report its memory (GPU is lost)"
    );
    let (_, majin) = app.get("/api/machines/majin").await;
    assert_eq!(
        majin["gpus"][0].get("problem"),
        None,
        "another machine's GPU 1 is not it"
    );
    app.fleet
        .measure("node", &[live(0, 5), live(1, 0)], &[], &[]);
    let (_, node) = app.get("/api/machines/node").await;
    assert_eq!(node["gpus"][1].get("problem"), None);
}
