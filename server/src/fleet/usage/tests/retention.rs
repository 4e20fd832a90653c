//! Retention: raw readings rolled up into runs keep the report's figures; old usage is deleted.

use super::{at, held, report, sample, T};
use crate::fleet::housekeeping::{tidy, Retention, Tidied};
use crate::fleet::usage::{figures, roll_up_hour, runs_of, Reading};
use crate::testing::{TestApp, MAJIN};
use axum::http::StatusCode;
use placement::usage::HOUR_MS;
use placement::{Bytes, Holding, Sample};
use proptest::prelude::*;
use serde_json::Value;
use std::time::Duration;

const DAY_MS: u64 = 24 * HOUR_MS;

/// A GPU's readings over `hours` from `from`: every 4 to 6 s with a gap of ten minutes now and then, a
/// utilisation that wanders, an energy counter that grows, is now and then missing and is reset once in a
/// while (a driver reload), and readings on the hour and at `also`.
fn history(seed: u64, from: u64, hours: u64, also: &[u64]) -> Vec<Sample> {
    let mut state = seed;
    let mut next = |n: u64| {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (state >> 33) % n
    };
    let end = from + hours * HOUR_MS;
    let mut times: Vec<u64> = (0..=hours).map(|h| from + h * HOUR_MS).collect();
    times.extend(also.iter().copied().filter(|&t| t >= from && t < end));
    let mut at = from + next(5000);
    while at < end {
        times.push(at);
        at += 4000 + next(2001);
        if next(400) == 0 {
            at += 10 * 60 * 1000;
        }
    }
    times.sort_unstable();
    times.dedup();
    let mut energy = 1_000_000u64;
    times
        .into_iter()
        .filter(|&t| t < end)
        .map(|at_ms| {
            energy += next(3_000_000);
            if next(1500) == 0 {
                energy = next(1000);
            }
            Sample {
                at_ms,
                utilisation_percent: next(101) as u32,
                energy_mj: (next(40) != 0).then_some(energy),
            }
        })
        .collect()
}

/// Keeps `samples` as `machine`'s GPU `gpu`'s readings.
async fn record(app: &TestApp, machine: &str, gpu: u32, samples: &[Sample]) {
    let mut tx = app.pool.begin().await.unwrap();
    for s in samples {
        sqlx::query("INSERT INTO gpu_samples (machine, gpu_index, at_ms, utilisation_percent, energy_mj) VALUES (?, ?, ?, ?, ?)")
            .bind(machine)
            .bind(i64::from(gpu))
            .bind(s.at_ms as i64)
            .bind(i64::from(s.utilisation_percent))
            .bind(s.energy_mj.map(|e| e as i64))
            .execute(&mut *tx)
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();
}

async fn count(app: &TestApp, table: &str) -> i64 {
    let sql = match table {
        "gpu_samples" => "SELECT COUNT(*) FROM gpu_samples",
        "gpu_sample_runs" => "SELECT COUNT(*) FROM gpu_sample_runs",
        "holdings" => "SELECT COUNT(*) FROM holdings",
        other => panic!("no table {other} to count"),
    };
    sqlx::query_scalar(sql).fetch_one(&app.pool).await.unwrap()
}

/// A GPU shared by two workers whose spans begin and end within hours, a whole GPU held since `T` + 30
/// min and still held, and six hours of readings of both GPUs.
async fn six_hours_of_sharing(app: &TestApp) {
    let listen = (
        T + 10 * 60_000 + 17_123,
        T + 2 * HOUR_MS + 40 * 60_000 + 3_001,
    );
    let voice = (T + HOUR_MS, T + 4 * HOUR_MS + 20 * 60_000);
    let voice_more = (voice.1, T + 5 * HOUR_MS + 30 * 60_000 + 999);
    held(app, "listen", "majin", 0, 2, 8, listen).await;
    held(app, "voice", "majin", 0, 4, 8, voice).await;
    held(app, "voice", "majin", 0, 6, 8, voice_more).await;
    sqlx::query("INSERT INTO holdings (holder, name, group_name, machine, gpu_index, held_bytes, gpu_total_bytes, start_ms) VALUES ('group:g/glm@atlas', 'glm', 'g', 'atlas', 1, ?1, ?1, ?2)")
        .bind(Bytes::gb(96).get() as i64)
        .bind((T + 30 * 60_000) as i64)
        .execute(&app.pool)
        .await
        .unwrap();
    // A reading exactly where a span begins or ends, and one a millisecond after.
    let edges = [listen.0, listen.1 + 1, voice.1, voice_more.1];
    record(app, "majin", 0, &history(1, T, 6, &edges)).await;
    record(app, "atlas", 1, &history(2, T, 6, &[])).await;
}

/// The reports (JSON, every grouping) and a CSV over whole-hour periods in and around the history.
async fn reports(app: &TestApp) -> Vec<Value> {
    let mut out = Vec::new();
    for (from, to) in [
        (T, T + 6 * HOUR_MS),
        (T - HOUR_MS, T + 7 * HOUR_MS),
        (T + HOUR_MS, T + 2 * HOUR_MS),
        (T + 2 * HOUR_MS, T + 5 * HOUR_MS),
        (T - DAY_MS, T + DAY_MS),
    ] {
        for by in ["worker", "model", "group", "machine"] {
            out.push(report(app, from, to, by).await);
        }
        let (status, csv) = app
            .get(&format!(
                "/api/usage.csv?from={}&to={}&by=worker",
                at(from),
                at(to)
            ))
            .await;
        assert_eq!(status, StatusCode::OK);
        out.push(csv);
    }
    out
}

#[tokio::test]
async fn samples_older_than_the_retention_are_rolled_up_and_the_report_keeps_its_figures() {
    let app = TestApp::new(MAJIN).await;
    six_hours_of_sharing(&app).await;
    let raw = count(&app, "gpu_samples").await;
    let before = reports(&app).await;
    assert_ne!(before[0]["total"]["figures"]["busy_gpu_ms"], Value::Null);
    assert_ne!(before[0]["total"]["figures"]["energy_mj"], Value::Null);

    let tidied = tidy(
        &app.pool,
        &Retention::default(),
        T + 8 * DAY_MS,
        Duration::ZERO,
    )
    .await
    .unwrap();
    assert_eq!(tidied.samples_rolled_up, raw as u64);
    assert_eq!(count(&app, "gpu_samples").await, 0);
    let runs = count(&app, "gpu_sample_runs").await;
    assert!(
        runs <= 2 * 6 + 8,
        "{runs} runs: one an hour per GPU and one more at each holding's start or end"
    );
    assert_eq!(reports(&app).await, before);
}

#[tokio::test]
async fn recent_samples_are_kept_raw() {
    let app = TestApp::new(MAJIN).await;
    six_hours_of_sharing(&app).await;
    let before = reports(&app).await;
    let recent: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM gpu_samples WHERE at_ms >= ?")
        .bind((T + 2 * HOUR_MS) as i64)
        .fetch_one(&app.pool)
        .await
        .unwrap();
    // A week after T + 2 h 30 min: the readings of the hours before T + 2 h are older than a week.
    tidy(
        &app.pool,
        &Retention::default(),
        T + 7 * DAY_MS + 2 * HOUR_MS + 30 * 60_000,
        Duration::ZERO,
    )
    .await
    .unwrap();
    assert_eq!(count(&app, "gpu_samples").await, recent);
    let rolled_until: i64 = sqlx::query_scalar("SELECT MAX(last_ms) FROM gpu_sample_runs")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert!(rolled_until < (T + 2 * HOUR_MS) as i64);
    // Reports across the line read the runs before it and the raw readings after.
    assert_eq!(reports(&app).await, before);
}

#[tokio::test]
async fn a_roll_up_killed_half_way_loses_and_double_counts_nothing() {
    let app = TestApp::new(MAJIN).await;
    six_hours_of_sharing(&app).await;
    let raw = count(&app, "gpu_samples").await;
    let before = reports(&app).await;
    let now = T + 8 * DAY_MS;
    let cutoff = now - 7 * DAY_MS;

    // Killed inside an hour's transaction: nothing of it happened.
    {
        let mut tx = crate::db::write(&app.pool).await.unwrap();
        let rolled = roll_up_hour(&mut tx, "majin", 0, cutoff).await.unwrap();
        assert!(rolled.unwrap() > 0);
        drop(tx);
    }
    assert_eq!(count(&app, "gpu_samples").await, raw);
    assert_eq!(count(&app, "gpu_sample_runs").await, 0);
    assert_eq!(reports(&app).await, before);

    // Killed after two hours of one GPU were committed: those are runs, the rest raw.
    for _ in 0..2 {
        let mut tx = crate::db::write(&app.pool).await.unwrap();
        roll_up_hour(&mut tx, "majin", 0, cutoff)
            .await
            .unwrap()
            .unwrap();
        tx.commit().await.unwrap();
    }
    assert!(count(&app, "gpu_samples").await < raw);
    assert_eq!(reports(&app).await, before);

    // The next round goes on from there, and one more finds nothing to do.
    let first = tidy(&app.pool, &Retention::default(), now, Duration::ZERO)
        .await
        .unwrap();
    assert!(first.samples_rolled_up > 0);
    assert_eq!(count(&app, "gpu_samples").await, 0);
    let runs = count(&app, "gpu_sample_runs").await;
    assert_eq!(reports(&app).await, before);
    let again = tidy(&app.pool, &Retention::default(), now, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(again, Tidied::default());
    assert_eq!(count(&app, "gpu_sample_runs").await, runs);
    assert_eq!(reports(&app).await, before);
}

#[tokio::test]
async fn usage_and_peaks_older_than_their_retention_are_deleted_and_what_is_open_or_recent_is_kept()
{
    let app = TestApp::new(MAJIN).await;
    // An old span and its readings; a recent span and its readings; the whole GPU held since long ago.
    held(&app, "old", "majin", 0, 2, 8, (T, T + HOUR_MS)).await;
    record(&app, "majin", 0, &history(3, T, 2, &[])).await;
    let recent = T + 300 * DAY_MS;
    held(&app, "listen", "majin", 0, 2, 8, (recent, recent + HOUR_MS)).await;
    record(&app, "majin", 0, &history(4, recent, 1, &[])).await;
    sqlx::query("INSERT INTO holdings (holder, name, machine, gpu_index, held_bytes, gpu_total_bytes, start_ms) VALUES ('trainer', 'trainer', 'atlas', 1, 1, 1, ?)")
        .bind((T - 10 * DAY_MS) as i64)
        .execute(&app.pool)
        .await
        .unwrap();
    for (holder, last) in [("old", T + HOUR_MS), ("listen", recent + HOUR_MS)] {
        sqlx::query("INSERT INTO share_peaks (holder, model, machine, gpu_index, share_bytes, gpu_total_bytes, peak_bytes, first_ms, last_ms) VALUES (?1, ?1, 'majin', 0, 2, 8, 1, ?2, ?2)")
            .bind(holder)
            .bind(last as i64)
            .execute(&app.pool)
            .await
            .unwrap();
    }
    let recent_report = report(&app, recent, recent + HOUR_MS, "worker").await;

    // 400 days after T + 3 h.
    let tidied = tidy(
        &app.pool,
        &Retention::default(),
        T + 400 * DAY_MS + 3 * HOUR_MS,
        Duration::ZERO,
    )
    .await
    .unwrap();
    assert_eq!(
        tidied.usage_deleted,
        1 + 2 + 1,
        "the old span, its two hours of runs and its peak"
    );
    let peaks: Vec<String> = sqlx::query_scalar("SELECT holder FROM share_peaks")
        .fetch_all(&app.pool)
        .await
        .unwrap();
    assert_eq!(peaks, ["listen"]);
    let left: Vec<String> = sqlx::query_scalar("SELECT name FROM holdings ORDER BY id")
        .fetch_all(&app.pool)
        .await
        .unwrap();
    assert_eq!(left, ["listen", "trainer"]);
    let oldest_run: i64 = sqlx::query_scalar("SELECT MIN(first_ms) FROM gpu_sample_runs")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(oldest_run, recent as i64);
    assert_eq!(count(&app, "gpu_samples").await, 0);
    assert_eq!(
        report(&app, recent, recent + HOUR_MS, "worker").await,
        recent_report
    );
}

#[tokio::test]
async fn a_retention_of_zero_days_keeps_everything_for_good() {
    let app = TestApp::new(MAJIN).await;
    six_hours_of_sharing(&app).await;
    let (raw, holdings) = (
        count(&app, "gpu_samples").await,
        count(&app, "holdings").await,
    );
    let tidied = tidy(
        &app.pool,
        &Retention::days(0, 0, 0),
        T + 1000 * DAY_MS,
        Duration::ZERO,
    )
    .await
    .unwrap();
    assert_eq!(tidied, Tidied::default());
    assert_eq!(count(&app, "gpu_samples").await, raw);
    assert_eq!(count(&app, "holdings").await, holdings);
}

#[tokio::test]
async fn a_period_that_begins_inside_a_rolled_up_hour_counts_that_hours_part_in_proportion() {
    let app = TestApp::new(MAJIN).await;
    held(&app, "trainer", "majin", 0, 8, 8, (T, T + 2 * HOUR_MS)).await;
    // Busy for the first half hour, idle for the second.
    let quarter = HOUR_MS / 4;
    for (i, utilisation) in [0, 100, 100, 0, 0].into_iter().enumerate() {
        sample(&app, "majin", 0, T + i as u64 * quarter, utilisation, 0).await;
    }
    let half = || report(&app, T + HOUR_MS / 2, T + HOUR_MS, "worker");
    let figures = |body: Value| body["rows"][0]["figures"].clone();
    let raw = figures(half().await);
    assert_eq!(raw["busy_gpu_ms"], 0);
    tidy(
        &app.pool,
        &Retention::default(),
        T + 8 * DAY_MS,
        Duration::ZERO,
    )
    .await
    .unwrap();
    // The hour's run holds its readings from T to T + 45 min, busy 30 min of them: the period takes the
    // 15 min of it that it covers as a third of that, and the last quarter (idle) as read.
    let rolled = figures(half().await);
    assert_eq!(rolled["busy_gpu_ms"], 10 * 60_000);
    assert_eq!(rolled["gpu_ms"], raw["gpu_ms"]);
    // Whole hours keep their figures.
    assert_eq!(
        figures(report(&app, T, T + HOUR_MS, "worker").await)["busy_gpu_ms"],
        30 * 60_000
    );
}

/// The readings of a GPU as the report selects them for a period ending at `to`: raw ones up to `to`, or
/// runs that begin by `to`.
fn up_to(to: u64, readings: impl IntoIterator<Item = Reading>) -> Vec<Reading> {
    readings.into_iter().filter(|r| r.at_ms() <= to).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    /// Any readings, any spans, any period of whole hours: the figures from the runs (cut on the hour and
    /// where spans begin and end) are the figures from the raw readings, which are placement's.
    #[test]
    fn a_report_over_whole_hours_gives_the_same_figures_from_runs_as_from_raw_readings(
        steps in prop::collection::vec((1u64..900_000, 0u32..=100, 0u64..5_000_000, 0u8..20), 1..200),
        bounds in prop::collection::vec(0u64..4 * HOUR_MS, 2..8),
        held_gb in 1u64..=8,
        (first_hour, hours) in (0u64..4, 1u64..5),
    ) {
        let mut at = T;
        let mut energy = 0u64;
        let samples: Vec<Sample> = steps
            .iter()
            .map(|&(step, utilisation_percent, grows, kind)| {
                at += step;
                energy = if kind == 0 { grows / 1000 } else { energy + grows };
                Sample { at_ms: at, utilisation_percent, energy_mj: (kind != 1).then_some(energy) }
            })
            .collect();
        let mut cuts: Vec<u64> = bounds.iter().map(|b| T + b).collect();
        cuts.sort_unstable();
        // Runs as the roll-up makes them: hour by hour, cut at every span's start and end.
        let mut runs = Vec::new();
        let mut hour_start = T;
        while hour_start <= at {
            let hour_end = hour_start + HOUR_MS;
            let in_hour = samples.iter().copied().filter(|s| s.at_ms >= hour_start && s.at_ms < hour_end);
            runs.extend(runs_of(in_hour, cuts.iter().copied().filter(|&c| c > hour_start && c < hour_end)));
            hour_start = hour_end;
        }
        prop_assert_eq!(runs.iter().map(|r| r.samples).sum::<u64>(), samples.len() as u64);
        let (from, to) = (T + first_hour * HOUR_MS, T + (first_hour + hours) * HOUR_MS);
        let raw = up_to(to, samples.iter().copied().map(Reading::Raw));
        let rolled = up_to(to, runs.into_iter().map(Reading::Run));
        let raw_samples: Vec<Sample> = samples.iter().copied().filter(|s| s.at_ms <= to).collect();
        for pair in cuts.windows(2) {
            let span = Holding { start_ms: pair[0], end_ms: pair[1], held: Bytes::gb(held_gb), gpu_total: Bytes::gb(8) };
            let Some(span) = span.clip(from, to) else { continue };
            let expected = span.figures(&raw_samples);
            prop_assert_eq!(figures(&span, &raw), expected);
            prop_assert_eq!(figures(&span, &rolled), expected);
        }
    }
}
