//! A GPU's sharing switched among random writes, settled by its rows (issue 29): after every step the
//! state kept is the one rebuilt from the database, and the runtime runs what the committed state wants.

use super::{pinned, set};
use crate::testing::atlas_here_with_catalog;
use axum::http::{Method, StatusCode};
use proptest::prelude::*;
use serde_json::json;

const GPUS: [&str; 2] = ["atlas:0", "atlas:1"];

#[derive(Debug, Clone)]
enum Step {
    /// A worker of `gb` pinned to a GPU.
    Create {
        name: u8,
        gb: u8,
        gpu: usize,
    },
    Delete {
        name: u8,
    },
    /// glm-5.3 deployed into a group on a GPU, at `percent`.
    Deploy {
        gpu: usize,
        percent: u8,
    },
    /// A GPU shared under MPS (with a compute share, or none) or time-sliced again.
    Share {
        gpu: usize,
        mps: Option<Option<u8>>,
    },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (0u8..6, 1u8..30, 0..GPUS.len()).prop_map(|(name, gb, gpu)| Step::Create { name, gb, gpu }),
        2 => (0u8..6).prop_map(|name| Step::Delete { name }),
        1 => (0..GPUS.len(), 1u8..60).prop_map(|(gpu, percent)| Step::Deploy { gpu, percent }),
        3 => (0..GPUS.len(), proptest::option::of(proptest::option::of(10u8..=100)))
            .prop_map(|(gpu, mps)| Step::Share { gpu, mps }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn a_gpu_s_sharing_settled_by_its_rows_is_what_the_rebuild_makes_and_the_runtime_runs_it(
        steps in prop::collection::vec(step(), 1..20),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let app = atlas_here_with_catalog().await;
            for step in &steps {
                let (status, answer) = match step {
                    Step::Create { name, gb, gpu } => {
                        app.post_worker(&pinned(&format!("w{name}"), f64::from(*gb), GPUS[*gpu])).await
                    }
                    Step::Delete { name } => {
                        app.call(Method::DELETE, &format!("/api/workers/w{name}"), None).await
                    }
                    Step::Deploy { gpu, percent } => {
                        let body = json!({"model": "glm-5.3", "gpus": [GPUS[*gpu]], "share": percent});
                        app.call(Method::POST, "/api/deployments", Some(&body.to_string())).await
                    }
                    Step::Share { gpu, mps } => {
                        let body = match mps {
                            Some(compute) => json!({"mode": "mps", "compute_percent": compute}),
                            None => json!({"mode": "time-slicing"}),
                        };
                        set(&app, GPUS[*gpu], body).await
                    }
                };
                assert!(status != StatusCode::INTERNAL_SERVER_ERROR, "after {step:?}: {answer}");
                app.fleet
                    .check_ledger()
                    .await
                    .unwrap_or_else(|e| panic!("after {step:?}: {e}"));
                app.fleet
                    .check_engines()
                    .await
                    .unwrap_or_else(|e| panic!("after {step:?}: {e}"));
            }
        });
    }
}
