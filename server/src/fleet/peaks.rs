//! The most each shared engine was measured to hold, kept per share it had (issue 32), and read back as
//! the Models tab's "peak 4.1 GB of its 10 GB share over 3 days" with the smaller share that would do.
//!
//! Taken from the same per-process readings that catch a broken promise ([`Fleet::measure`]), in the
//! transaction that keeps each reading ([`Fleet::record_samples`]): NVML's on this machine, the simulated
//! driver's in the demo, and a cluster's node's own, its engines' processes named by the reporter beside
//! each job.

use super::Fleet;
use crate::catalog::Engine;
use crate::error::ApiError;
use app::views::RightSized;
use placement::holder::Holder;
use placement::rightsize::{Fit, Peak};
use placement::{Bytes, GpuRef, Hold};

/// A peak on one GPU, as kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuPeak {
    /// The machine.
    pub machine: String,
    /// The GPU's index there.
    pub gpu: u32,
    /// What was measured, against which share.
    pub peak: Peak,
}

impl Fleet {
    /// The engines' last measurements on `machine` against the shares they hold now, to be kept as peaks
    /// ([`write_peaks`]). A whole GPU is no share, and a holder the ledger no longer knows has nothing to
    /// measure against. Taken under the write lock, and before any transaction: writes take that lock first.
    pub(super) async fn measured_shares(&self, machine: &str) -> Vec<MeasuredShare> {
        let measured: Vec<(u32, String, Bytes)> = self
            .measured
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .filter(|((m, _, _), _)| m == machine)
            .map(|((_, gpu, holder), bytes)| (*gpu, holder.clone(), *bytes))
            .collect();
        if measured.is_empty() {
            return Vec::new();
        }
        let state = self.state.lock().await;
        let ledger = &state.ledger;
        let Some(inventory) = ledger.inventory().machine(machine) else {
            return Vec::new();
        };
        measured
            .into_iter()
            .filter_map(|(gpu, holder, used)| {
                let total = inventory.gpus.iter().find(|g| g.index == gpu)?.total;
                let Hold::Shared(sharers) = ledger.scheduler().hold(&GpuRef::new(machine, gpu))?
                else {
                    return None;
                };
                let share = *sharers.get(&holder)?;
                (share > Bytes::ZERO).then_some(MeasuredShare {
                    gpu,
                    holder,
                    share,
                    total,
                    used,
                })
            })
            .collect()
    }

    /// `model`'s peaks in `group` on the shares it holds now, one per GPU, the fullest first: what its
    /// engines were measured to take of each.
    pub async fn peaks(&self, group: &str, model: &str) -> Result<Vec<GpuPeak>, ApiError> {
        let committed = self.committed();
        let fills_share = committed
            .model(model)
            .is_some_and(|m| matches!(m.engine, Engine::Vllm | Engine::Sglang));
        let Some(group) = committed.groups.iter().find(|g| g.name == group) else {
            return Ok(Vec::new());
        };
        let now: Vec<(String, String, u32, Bytes)> = {
            let state = self.state.lock().await;
            group
                .gpus
                .iter()
                .filter_map(|gpu| {
                    let holder = group.unit_on(model, gpu);
                    let Hold::Shared(sharers) = state.ledger.scheduler().hold(gpu)? else {
                        return None;
                    };
                    let share = *sharers.get(&holder)?;
                    Some((holder, gpu.machine.clone(), gpu.index, share))
                })
                .collect()
        };
        if now.is_empty() {
            return Ok(Vec::new());
        }
        type Row = (String, String, i64, i64, i64, i64, i64, i64);
        let rows: Vec<Row> = sqlx::query_as(
            "SELECT holder, machine, gpu_index, share_bytes, gpu_total_bytes, peak_bytes, first_ms, last_ms \
             FROM share_peaks WHERE model = ?",
        )
        .bind(model)
        .fetch_all(&self.pool)
        .await?;
        let count = |v: i64| Bytes(u64::try_from(v).unwrap_or(0));
        let mut peaks: Vec<GpuPeak> = rows
            .into_iter()
            .filter(|(holder, machine, gpu, share, ..)| {
                now.iter().any(|(h, m, g, s)| {
                    h == holder && m == machine && i64::from(*g) == *gpu && s.get() as i64 == *share
                })
            })
            .map(
                |(_, machine, gpu, share, total, peak, first, last)| GpuPeak {
                    machine,
                    gpu: u32::try_from(gpu).unwrap_or(0),
                    peak: Peak {
                        peak: count(peak),
                        share: count(share),
                        gpu_total: count(total),
                        observed_ms: u64::try_from(last - first).unwrap_or(0),
                        fills_share,
                    },
                },
            )
            .collect();
        peaks.sort_by(|a, b| {
            fullness(&b.peak)
                .cmp(&fullness(&a.peak))
                .then_with(|| (&a.machine, a.gpu).cmp(&(&b.machine, b.gpu)))
        });
        Ok(peaks)
    }
}

impl Fleet {
    /// `model`'s peaks in the group it is a member of, the fullest GPU first; none where it is in no group.
    pub async fn model_peaks(&self, model: &str) -> Result<Vec<GpuPeak>, ApiError> {
        if self.committed().model(model).is_none() {
            return Err(ApiError::NotFound(format!(
                "no model {model} in the catalog"
            )));
        }
        let group = self.committed().group_of(model).map(|g| g.name.clone());
        match group {
            Some(group) => self.peaks(&group, model).await,
            None => Ok(Vec::new()),
        }
    }

    /// Every member whose measured peak allows a smaller share (`Fit::Smaller` on its fullest GPU), with
    /// that share: what the repack preview counts when asked for right-sized shares. System members'
    /// shares are not the operator's to change, and are left out.
    pub async fn right_sized(&self) -> Result<Vec<RightSized>, ApiError> {
        let committed = self.committed();
        let system = self.system_models();
        let mut out = Vec::new();
        for group in &committed.groups {
            for member in &group.members {
                if system.contains(&member.member) {
                    continue;
                }
                let peaks = self.peaks(&group.name, &member.member).await?;
                let Some(Fit::Smaller { share }) = peaks.first().map(|p| p.peak.fit()) else {
                    continue;
                };
                let units: Vec<String> = group
                    .units(&member.member)
                    .into_iter()
                    .map(|(unit, _)| unit)
                    .collect();
                out.push(RightSized {
                    group: group.name.clone(),
                    member: member.member.clone(),
                    from: member.share,
                    to: share,
                    units,
                });
            }
        }
        Ok(out)
    }
}

/// One engine's measurement on a GPU against the share it holds there.
pub(super) struct MeasuredShare {
    gpu: u32,
    holder: String,
    share: Bytes,
    total: Bytes,
    used: Bytes,
}

/// Keeps `measured` on `machine` at `at_ms` as peaks, in the reading's own transaction.
pub(super) async fn write_peaks(
    tx: &mut sqlx::SqliteConnection,
    machine: &str,
    measured: Vec<MeasuredShare>,
    at_ms: u64,
) -> Result<(), ApiError> {
    for m in measured {
        sqlx::query(
            "INSERT INTO share_peaks (holder, model, machine, gpu_index, share_bytes, gpu_total_bytes, peak_bytes, first_ms, last_ms) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?8) \
             ON CONFLICT (holder, machine, gpu_index, share_bytes) DO UPDATE SET \
             peak_bytes = MAX(peak_bytes, excluded.peak_bytes), last_ms = MAX(last_ms, excluded.last_ms), \
             gpu_total_bytes = excluded.gpu_total_bytes",
        )
        .bind(&m.holder)
        .bind(Holder::parse(&m.holder).name())
        .bind(machine)
        .bind(i64::from(m.gpu))
        .bind(m.share.get() as i64)
        .bind(m.total.get() as i64)
        .bind(m.used.get() as i64)
        .bind(at_ms as i64)
        .execute(&mut *tx)
        .await?;
    }
    Ok(())
}

/// How full a share got, for putting the fullest first.
fn fullness(peak: &Peak) -> u128 {
    u128::from(peak.peak.get()) * 1_000_000 / u128::from(peak.share.get().max(1))
}

#[cfg(test)]
mod tests {
    use crate::inventory::GpuLive;
    use axum::http::StatusCode;
    use placement::rightsize::Fit;
    use placement::{BasisPoints, Bytes};
    use serde_json::json;

    const DAY: u64 = 86_400_000;
    const SPEECH: &str = "group:speech/speech@atlas";

    fn holding(pid: u32, gb: f64) -> GpuLive {
        GpuLive {
            index: 0,
            utilisation_percent: 10,
            power_mw: None,
            temperature_c: None,
            energy_mj: None,
            used: Bytes::gb(20),
            processes: vec![(pid, Bytes::from_gb(gb).unwrap())],
            problem: None,
        }
    }

    /// The demo catalog's fleet with speech deployed on 10 % of atlas's GPU 0.
    async fn speech_on_atlas() -> crate::testing::TestApp {
        let app = crate::testing::majin_and_atlas_with_catalog().await;
        let (status, body) = app
            .deploy(json!({"model": "speech", "gpus": ["atlas:0"], "share": 10}))
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        app
    }

    /// `pid` holds `gb` on atlas's GPU 0 at `at_ms`, as one reading sees it: measured against the
    /// engines `running` and kept, as the followers do.
    async fn read_atlas(
        app: &crate::testing::TestApp,
        running: &[(String, Vec<u32>)],
        pid: u32,
        gb: f64,
        at_ms: u64,
    ) {
        read_atlas_with(app, running, &[], pid, gb, at_ms).await;
    }

    /// [`read_atlas`], with what the engines `reported` they allocated.
    async fn read_atlas_with(
        app: &crate::testing::TestApp,
        running: &[(String, Vec<u32>)],
        reported: &[(String, Vec<(u32, Bytes)>)],
        pid: u32,
        gb: f64,
        at_ms: u64,
    ) {
        let reading = [holding(pid, gb)];
        app.fleet.measure("atlas", &reading, running, reported);
        let atlas = app
            .fleet
            .committed_inventory()
            .await
            .machine("atlas")
            .cloned()
            .unwrap();
        app.fleet
            .record_samples(&atlas, &reading, at_ms)
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn a_models_peak_is_kept_per_share_and_a_smaller_share_that_holds_it_is_offered_on_the_models_tab(
    ) {
        let app = speech_on_atlas().await;
        let running = vec![(SPEECH.to_owned(), vec![777])];
        let read = |gb: f64, at_ms: u64| read_atlas(&app, &running, 777, gb, at_ms);
        // Three days on 10 % of a 96 GB GPU (9.6 GB), never past 4.1 GB.
        for (gb, at) in [(3.0, 0), (4.1, DAY), (3.5, 3 * DAY)] {
            read(gb, 1_000 + at).await;
        }
        let peaks = app.fleet.peaks("speech", "speech").await.unwrap();
        assert_eq!(peaks.len(), 1);
        let peak = peaks[0].peak;
        assert_eq!(
            (peak.peak, peak.share, peak.observed_ms),
            (
                Bytes::from_gb(4.1).unwrap(),
                Bytes::gb(96).share(BasisPoints::percent(10)),
                3 * DAY
            )
        );
        // 4.1 GB and a fifth is 4.92 GB: 6 % of 96 GB (5.76 GB) holds it.
        assert_eq!(
            peak.fit(),
            Fit::Smaller {
                share: BasisPoints::percent(6)
            }
        );
        let models = app.get("/models").await.1.as_str().unwrap().to_owned();
        assert!(
            models.contains(
                "peak 4.1 GB of its 9.6 GB share over 3 days: 6 % (5.8 GB) would hold it with 20 % to spare"
            ),
            "{models}"
        );
        assert!(
            models.contains("href=\"/models/speech/sharing?share=6\""),
            "{models}"
        );
        let right_sized = app.fleet.right_sized().await.unwrap();
        assert_eq!(
            right_sized
                .iter()
                .map(|r| (r.from, r.to, r.units.clone()))
                .collect::<Vec<_>>(),
            [(
                BasisPoints::percent(10),
                BasisPoints::percent(6),
                vec![SPEECH.to_owned()]
            )],
            "what the repack preview counts"
        );

        let (status, rest) = app.get("/api/models/speech/peaks").await;
        assert_eq!(status, StatusCode::OK, "{rest}");
        assert_eq!(
            (
                &rest[0]["machine"],
                &rest[0]["gpu"],
                &rest[0]["verdict"],
                &rest[0]["smaller_share_percent"]
            ),
            (&json!("atlas"), &json!(0), &json!("smaller"), &json!(6.0))
        );
        assert_eq!(rest[0]["peak_bytes"], Bytes::from_gb(4.1).unwrap().get());
        let (status, _) = app.get("/api/models/nothing/peaks").await;
        assert_eq!(status, StatusCode::NOT_FOUND);

        // Taken: the new share has no peak until its engine is read again, and the old one is not its.
        let (status, change) = app
            .put_plan("speech", json!({"revision": 1, "shares": {"speech": 6}}))
            .await;
        assert_eq!(status, StatusCode::OK, "{change}");
        assert!(app
            .fleet
            .peaks("speech", "speech")
            .await
            .unwrap()
            .is_empty());
        read(5.6, 4 * DAY).await;
        let peak = app.fleet.peaks("speech", "speech").await.unwrap()[0].peak;
        assert_eq!(
            (peak.share, peak.observed_ms),
            (Bytes::gb(96).share(BasisPoints::percent(6)), 0)
        );
        assert_eq!(peak.fit(), Fit::Close, "5.6 of 5.76 GB is within 5 % of it");
    }

    #[tokio::test]
    async fn a_model_whose_engine_fills_its_share_is_offered_no_smaller_one() {
        let app = crate::testing::majin_and_atlas_with_catalog().await;
        let vllm = app
            .fleet
            .models()
            .into_iter()
            .find(|m| m.engine == crate::catalog::Engine::Vllm && !m.system)
            .expect("a vLLM model in the demo catalog");
        let (status, body) = app
            .deploy(json!({"model": vllm.name, "gpus": ["atlas:0"], "share": 20}))
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        let group = body["group"].as_str().unwrap().to_owned();
        let unit = placement::holder::member(&group, &vllm.name, "atlas");
        let running = vec![(unit, vec![900])];
        for at in [0, 3 * DAY] {
            read_atlas(&app, &running, 900, 5.0, at).await;
        }
        let peak = app.fleet.peaks(&group, &vllm.name).await.unwrap()[0].peak;
        assert_eq!(peak.fit(), Fit::FillsShare);
    }

    #[tokio::test]
    async fn an_engine_whose_processes_the_reading_ties_no_memory_to_is_measured_by_its_own_report()
    {
        let app = speech_on_atlas().await;
        let running = vec![(SPEECH.to_owned(), vec![777])];
        let said = |gb: f64| vec![(SPEECH.to_owned(), vec![(0, Bytes::from_gb(gb).unwrap())])];
        // Under MPS the driver shows the memory on the daemon's server (4242), not on the engine (777).
        read_atlas_with(&app, &running, &said(3.2), 4242, 5.0, 1_000).await;
        let peak = app.fleet.peaks("speech", "speech").await.unwrap()[0].peak;
        assert_eq!(peak.peak, Bytes::from_gb(3.2).unwrap());
        // Where the reading ties memory to its processes, that is what it holds, whatever it said.
        let reading = [holding(777, 2.5)];
        app.fleet.measure("atlas", &reading, &running, &said(3.2));
        let measured = app.fleet.measured_shares("atlas").await;
        assert_eq!(
            measured.iter().map(|m| m.used).collect::<Vec<_>>(),
            [Bytes::from_gb(2.5).unwrap()]
        );
    }
}
