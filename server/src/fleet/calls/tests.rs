//! The gateway's figures on a real SQLite file.

use super::*;
use crate::testing::{TestApp, MAJIN};

fn one(failed: bool, prompt_tokens: u64, completion_tokens: u64) -> Counts {
    Counts {
        requests: 1,
        failed: u64::from(failed),
        prompt_tokens,
        completion_tokens,
    }
}

#[tokio::test]
async fn requests_are_summed_per_model_and_key_over_the_hours_of_the_period_written_or_not() {
    let app = TestApp::new(MAJIN).await;
    let pool = &app.pool;
    let key = Key::token("ada", "ci", "tsr_1a2b3c");
    let console = Key::console("ada");
    let calls = Calls::default();
    let hour = 500 * HOUR_MS;
    calls.record("glm-5.3", &key, one(false, 10, 20), hour + 5);
    calls.record("glm-5.3", &key, one(true, 3, 0), hour + 7);
    calls.write(pool).await.unwrap();
    calls.record("glm-5.3", &key, one(false, 1, 2), hour + HOUR_MS + 1);
    calls.record("glm-5.3", &console, one(false, 4, 5), hour + 9);
    // The hour before the period and the one at its end are left out.
    calls.record("glm-5.3", &key, one(false, 100, 100), hour - 1);
    calls.record("glm-5.3", &key, one(false, 100, 100), hour + 2 * HOUR_MS);

    let rows = calls
        .report(pool, hour + HOUR_MS / 2, hour + 2 * HOUR_MS)
        .await
        .unwrap();
    assert_eq!(
        rows,
        vec![
            RequestRow {
                model: "glm-5.3".to_owned(),
                key: "ada/ci (tsr_1a2b3c…)".to_owned(),
                requests: 3,
                failed: 1,
                prompt_tokens: 14,
                completion_tokens: 22,
            },
            RequestRow {
                model: "glm-5.3".to_owned(),
                key: "ada (console)".to_owned(),
                requests: 1,
                failed: 0,
                prompt_tokens: 4,
                completion_tokens: 5,
            },
        ]
    );
    let metrics = prometheus::TextEncoder::new()
        .encode_to_string(&calls.registry().gather())
        .unwrap();
    for line in [
        "tessera_gateway_prompt_tokens_total{key=\"tsr_1a2b3c\",model=\"glm-5.3\"} 214",
        "tessera_gateway_requests_total{key=\"console/ada\",model=\"glm-5.3\"} 1",
    ] {
        assert!(metrics.contains(line), "{line} not in {metrics}");
    }
}

#[tokio::test]
async fn what_could_not_be_written_is_kept_and_written_by_the_next_write() {
    let app = TestApp::new(MAJIN).await;
    let pool = &app.pool;
    let key = Key::console("ada");
    let calls = Calls::default();
    calls.record("glm-5.3", &key, one(false, 10, 20), 7);
    sqlx::query("ALTER TABLE gateway_calls RENAME TO away")
        .execute(pool)
        .await
        .unwrap();
    assert!(calls.write(pool).await.is_err());
    sqlx::query("ALTER TABLE away RENAME TO gateway_calls")
        .execute(pool)
        .await
        .unwrap();
    calls.record("glm-5.3", &key, one(false, 1, 1), 8);
    let rows = calls.report(pool, 0, HOUR_MS).await.unwrap();
    assert_eq!(
        (
            rows[0].requests,
            rows[0].prompt_tokens,
            rows[0].completion_tokens
        ),
        (2, 11, 21)
    );
}

#[tokio::test]
async fn the_hours_that_ended_before_the_retention_are_deleted_and_the_rest_kept() {
    let app = TestApp::new(MAJIN).await;
    let pool = &app.pool;
    let key = Key::console("ada");
    let calls = Calls::default();
    for hour in 0..3 {
        calls.record("glm-5.3", &key, one(false, 1, 1), hour * HOUR_MS);
    }
    calls.write(pool).await.unwrap();
    let mut connection = pool.acquire().await.unwrap();
    assert_eq!(
        forget_before(&mut connection, 2 * HOUR_MS, 1000)
            .await
            .unwrap(),
        2
    );
    drop(connection);
    let rows = calls.report(pool, 0, 3 * HOUR_MS).await.unwrap();
    assert_eq!(rows[0].requests, 1);
}
