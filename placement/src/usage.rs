//! Usage accounting (seed 000): a shared GPU counts for each sharer by its share of the GPU's memory.
//!
//! A worker taking 2 GB of an 8 GB GPU for an hour is a quarter of a GPU-hour, with a quarter of the GPU's use
//! and energy. A whole GPU counts as one per GPU.

use crate::units::Bytes;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::ops::Add;

/// Milliseconds in an hour.
pub const HOUR_MS: u64 = 3_600_000;

/// GPU time in GPU-milliseconds: one GPU for one millisecond is 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct GpuMillis(pub u64);

impl GpuMillis {
    /// GPU-hours with up to three decimals, trailing zeros dropped: `0.25`, `1`.
    pub fn hours_text(self) -> String {
        thousandths_text(self.0, HOUR_MS)
    }
}

impl Add for GpuMillis {
    type Output = GpuMillis;
    fn add(self, other: GpuMillis) -> GpuMillis {
        GpuMillis(self.0 + other.0)
    }
}

/// `value / unit` rounded to three decimals, trailing zeros dropped.
fn thousandths_text(value: u64, unit: u64) -> String {
    let thousandths = (u128::from(value) * 1000 + u128::from(unit) / 2) / u128::from(unit);
    let (whole, frac) = (thousandths / 1000, thousandths % 1000);
    if frac == 0 {
        whole.to_string()
    } else {
        format!("{whole}.{}", format!("{frac:03}").trim_end_matches('0'))
    }
}

/// A span of time a worker held memory on one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holding {
    /// When it began, milliseconds since the epoch.
    pub start_ms: u64,
    /// When it ended.
    pub end_ms: u64,
    /// Memory held: the share for shared work, the GPU's total for a whole GPU.
    pub held: Bytes,
    /// The GPU's total memory.
    pub gpu_total: Bytes,
}

/// One reading of a GPU's live figures (NVML).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sample {
    /// When, milliseconds since the epoch.
    pub at_ms: u64,
    /// Percent of the time since the last reading in which a kernel ran.
    pub utilisation_percent: u32,
    /// The energy counter (millijoules since the driver loaded), where the GPU has one.
    pub energy_mj: Option<u64>,
}

/// What a holding (or a sum of them) used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Figures {
    /// GPU time.
    #[serde(rename = "gpu_ms")]
    pub gpu_time: GpuMillis,
    /// GPU time weighted by the GPU's utilisation; `None` where no reading covers any of it.
    #[serde(rename = "busy_gpu_ms")]
    pub busy: Option<GpuMillis>,
    /// Energy in millijoules; `None` where no reading covers any of it.
    pub energy_mj: Option<u64>,
}

impl Add for Figures {
    type Output = Figures;
    /// The sum; a figure is known when it is known for any part (it then covers the parts with readings).
    fn add(self, other: Figures) -> Figures {
        fn either<T: Add<Output = T>>(a: Option<T>, b: Option<T>) -> Option<T> {
            match (a, b) {
                (Some(a), Some(b)) => Some(a + b),
                (a, b) => a.or(b),
            }
        }
        Figures {
            gpu_time: self.gpu_time + other.gpu_time,
            busy: either(self.busy, other.busy),
            energy_mj: either(self.energy_mj, other.energy_mj),
        }
    }
}

impl Holding {
    /// This holding's part of a GPU-wide figure (energy in millijoules, utilisation-milliseconds), rounded
    /// down: the figure times held over total.
    pub fn part_of(&self, figure: u64) -> u64 {
        if self.gpu_total == Bytes::ZERO {
            return 0;
        }
        let held = self.held.min(self.gpu_total);
        (u128::from(figure) * u128::from(held.get()) / u128::from(self.gpu_total.get())) as u64
    }

    /// GPU time: duration times held over total.
    pub fn gpu_time(&self) -> GpuMillis {
        GpuMillis(self.part_of(self.end_ms.saturating_sub(self.start_ms)))
    }

    /// The part of it within `[from_ms, to_ms)`, if any.
    pub fn clip(&self, from_ms: u64, to_ms: u64) -> Option<Holding> {
        let start_ms = self.start_ms.max(from_ms);
        let end_ms = self.end_ms.min(to_ms);
        (start_ms < end_ms).then_some(Holding {
            start_ms,
            end_ms,
            ..*self
        })
    }

    /// Its GPU time, and its share of the GPU's use and energy from the GPU's `samples` (oldest first).
    ///
    /// A reading covers the time since the one before it: its utilisation for all of that time, and the
    /// growth of the energy counter spread evenly over it (a counter that went back, as after a driver
    /// reload, says nothing).
    pub fn figures(&self, samples: &[Sample]) -> Figures {
        let mut busy_ms: Option<u64> = None;
        let mut energy: Option<u64> = None;
        for pair in samples.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            let overlap = b
                .at_ms
                .min(self.end_ms)
                .saturating_sub(a.at_ms.max(self.start_ms));
            if b.at_ms <= a.at_ms || overlap == 0 {
                continue;
            }
            let utilisation = u64::from(b.utilisation_percent.min(100));
            *busy_ms.get_or_insert(0) += overlap * utilisation / 100;
            if let (Some(ea), Some(eb)) = (a.energy_mj, b.energy_mj) {
                if eb >= ea {
                    let part =
                        u128::from(eb - ea) * u128::from(overlap) / u128::from(b.at_ms - a.at_ms);
                    *energy.get_or_insert(0) += part as u64;
                }
            }
        }
        Figures {
            gpu_time: self.gpu_time(),
            busy: busy_ms.map(|ms| GpuMillis(self.part_of(ms))),
            energy_mj: energy.map(|mj| self.part_of(mj)),
        }
    }
}

/// What a usage report adds up by.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Grouping {
    /// Each worker, and each model of a sharing group.
    Worker,
    /// Each model; workers, which run no catalog model, under their own names.
    Model,
    /// Each sharing group; workers outside groups under "no group".
    Group,
    /// Each machine.
    #[default]
    Machine,
}

impl Grouping {
    /// Every grouping, in the order the report offers them.
    pub const ALL: [Grouping; 4] = [
        Grouping::Machine,
        Grouping::Group,
        Grouping::Model,
        Grouping::Worker,
    ];

    /// Its name in URLs and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Grouping::Worker => "worker",
            Grouping::Model => "model",
            Grouping::Group => "group",
            Grouping::Machine => "machine",
        }
    }

    /// The grouping named `name`.
    pub fn parse(name: &str) -> Option<Grouping> {
        Grouping::ALL.into_iter().find(|g| g.as_str() == name)
    }
}

/// Who held a GPU: a worker, or a model of a sharing group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    /// The worker's name, or the model's.
    pub name: String,
    /// The sharing group, for a model of one.
    pub group: Option<String>,
    /// The machine.
    pub machine: String,
}

/// Label of workers in a report by group.
pub const NO_GROUP: &str = "no group";

impl Holder {
    /// The row it counts in.
    pub fn key(&self, by: Grouping) -> String {
        match by {
            Grouping::Worker | Grouping::Model => self.name.clone(),
            Grouping::Group => self.group.clone().unwrap_or_else(|| NO_GROUP.to_owned()),
            Grouping::Machine => self.machine.clone(),
        }
    }
}

/// One row of a usage report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageRow {
    /// The worker, model, group or machine.
    pub name: String,
    /// What it used.
    pub figures: Figures,
}

impl UsageRow {
    /// GPU-hours, as shown: `0.25`.
    pub fn gpu_hours(&self) -> String {
        self.figures.gpu_time.hours_text()
    }

    /// GPU-hours weighted by utilisation, as shown; `—` without readings.
    pub fn busy_gpu_hours(&self) -> String {
        self.figures
            .busy
            .map_or_else(|| "—".to_owned(), GpuMillis::hours_text)
    }

    /// Energy in watt-hours, as shown; `—` without readings.
    pub fn energy_wh(&self) -> String {
        self.figures
            .energy_mj
            .map_or_else(|| "—".to_owned(), |mj| thousandths_text(mj, 3_600_000))
    }
}

/// A usage report: one row per key, most GPU time first, and the total.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageReport {
    /// From, milliseconds since the epoch.
    pub from_ms: u64,
    /// To (not included).
    pub to_ms: u64,
    /// What the rows are.
    pub by: Grouping,
    /// The rows.
    pub rows: Vec<UsageRow>,
    /// Their sum.
    pub total: UsageRow,
    /// What went through the gateway, per model and key, by the hour each request was asked in.
    #[serde(default)]
    pub requests: Vec<RequestRow>,
}

/// Requests through the gateway for one model with one API token, over a report's period.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestRow {
    /// The model the request named (a group's member it was routed to).
    pub model: String,
    /// The token: its account and name, and the first characters of its secret.
    pub key: String,
    /// Requests passed to an engine or refused for want of one.
    pub requests: u64,
    /// Of those, the ones that failed: no engine ready, or an error status from the engine.
    pub failed: u64,
    /// Prompt tokens, as the engines reported them in their answers' `usage`.
    pub prompt_tokens: u64,
    /// Completion tokens, likewise.
    pub completion_tokens: u64,
}

/// The gateway's requests as CSV: a header and one line per model and key.
pub fn requests_csv(rows: &[RequestRow]) -> String {
    let mut out = "model,key,requests,failed,prompt_tokens,completion_tokens\n".to_owned();
    for row in rows {
        out.push_str(&format!(
            "{},{},{},{},{},{}\n",
            csv_field(&row.model),
            csv_field(&row.key),
            row.requests,
            row.failed,
            row.prompt_tokens,
            row.completion_tokens
        ));
    }
    out
}

impl UsageReport {
    /// Adds up `parts` (each a holder and what one of its holdings used) by `by`.
    pub fn tally(
        from_ms: u64,
        to_ms: u64,
        by: Grouping,
        parts: impl IntoIterator<Item = (Holder, Figures)>,
    ) -> UsageReport {
        let mut sums: BTreeMap<String, Figures> = BTreeMap::new();
        for (holder, figures) in parts {
            let sum = sums.entry(holder.key(by)).or_default();
            *sum = *sum + figures;
        }
        let mut rows: Vec<UsageRow> = sums
            .into_iter()
            .map(|(name, figures)| UsageRow { name, figures })
            .collect();
        rows.sort_by(|a, b| {
            b.figures
                .gpu_time
                .cmp(&a.figures.gpu_time)
                .then_with(|| a.name.cmp(&b.name))
        });
        let total = UsageRow {
            name: "Total".to_owned(),
            figures: rows
                .iter()
                .fold(Figures::default(), |sum, row| sum + row.figures),
        };
        UsageReport {
            from_ms,
            to_ms,
            by,
            rows,
            total,
            requests: Vec::new(),
        }
    }

    /// The report as CSV: a header, one line per row, then the total; the figures as the page shows them.
    pub fn to_csv(&self) -> String {
        let mut out = format!("{},gpu_hours,busy_gpu_hours,energy_wh\n", self.by.as_str());
        for row in self.rows.iter().chain(std::iter::once(&self.total)) {
            let blank = |s: String| if s == "—" { String::new() } else { s };
            out.push_str(&format!(
                "{},{},{},{}\n",
                csv_field(&row.name),
                row.gpu_hours(),
                blank(row.busy_gpu_hours()),
                blank(row.energy_wh())
            ));
        }
        out
    }
}

/// A CSV field, quoted when it must be.
fn csv_field(text: &str) -> String {
    if text.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holding(start_ms: u64, end_ms: u64, held_gb: u64, total_gb: u64) -> Holding {
        Holding {
            start_ms,
            end_ms,
            held: Bytes::gb(held_gb),
            gpu_total: Bytes::gb(total_gb),
        }
    }

    fn sample(at_ms: u64, utilisation_percent: u32, energy_mj: u64) -> Sample {
        Sample {
            at_ms,
            utilisation_percent,
            energy_mj: Some(energy_mj),
        }
    }

    #[test]
    fn two_gb_of_an_eight_gb_gpu_for_an_hour_is_a_quarter_gpu_hour() {
        let h = holding(0, HOUR_MS, 2, 8);
        assert_eq!(h.gpu_time(), GpuMillis(HOUR_MS / 4));
        assert_eq!(h.gpu_time().hours_text(), "0.25");
        // and a quarter of the energy and use
        assert_eq!(h.part_of(1_000_000), 250_000);
    }

    #[test]
    fn a_whole_gpu_counts_as_one() {
        assert_eq!(holding(0, 2 * HOUR_MS, 96, 96).gpu_time().hours_text(), "2");
    }

    #[test]
    fn a_share_change_halfway_is_two_holdings() {
        let first = holding(0, HOUR_MS / 2, 2, 8);
        let second = holding(HOUR_MS / 2, HOUR_MS, 4, 8);
        assert_eq!((first.gpu_time() + second.gpu_time()).hours_text(), "0.375");
    }

    #[test]
    fn a_quarter_share_takes_a_quarter_of_the_use_and_energy_the_readings_show() {
        // The GPU ran at 80 % for the hour and used 1,000 Wh (3.6e9 mJ), read every half hour.
        let samples = [
            sample(0, 0, 0),
            sample(HOUR_MS / 2, 80, 1_800_000_000),
            sample(HOUR_MS, 80, 3_600_000_000),
        ];
        let figures = holding(0, HOUR_MS, 2, 8).figures(&samples);
        assert_eq!(figures.gpu_time.hours_text(), "0.25");
        assert_eq!(figures.busy.unwrap().hours_text(), "0.2");
        assert_eq!(figures.energy_mj, Some(900_000_000));
        // A holding of the second half hour only gets the second reading's part.
        let half = holding(HOUR_MS / 2, HOUR_MS, 2, 8).figures(&samples);
        assert_eq!(half.energy_mj, Some(450_000_000));
        // A reading period cut in two by the holding is split evenly.
        let quarter = holding(0, HOUR_MS / 4, 8, 8).figures(&samples);
        assert_eq!(quarter.energy_mj, Some(900_000_000));
        assert_eq!(quarter.busy, Some(GpuMillis(HOUR_MS / 5)));
    }

    #[test]
    fn without_readings_use_and_energy_are_unknown_not_zero() {
        let figures = holding(0, HOUR_MS, 2, 8).figures(&[]);
        assert_eq!(figures.busy, None);
        assert_eq!(figures.energy_mj, None);
        let row = UsageRow {
            name: "majin".into(),
            figures,
        };
        assert_eq!(row.busy_gpu_hours(), "—");
        assert_eq!(row.energy_wh(), "—");
    }

    #[test]
    fn an_energy_counter_that_went_back_says_nothing() {
        let samples = [sample(0, 50, 5_000), sample(1_000, 50, 10)];
        let figures = holding(0, 1_000, 8, 8).figures(&samples);
        assert_eq!(figures.energy_mj, None);
        assert_eq!(figures.busy, Some(GpuMillis(500)));
    }

    #[test]
    fn clipping_keeps_the_part_inside_the_period() {
        let h = holding(0, 2 * HOUR_MS, 2, 8);
        assert_eq!(
            h.clip(HOUR_MS, 3 * HOUR_MS)
                .unwrap()
                .gpu_time()
                .hours_text(),
            "0.25"
        );
        assert_eq!(h.clip(2 * HOUR_MS, 3 * HOUR_MS), None);
    }

    fn holder(name: &str, group: Option<&str>, machine: &str) -> Holder {
        Holder {
            name: name.into(),
            group: group.map(Into::into),
            machine: machine.into(),
        }
    }

    #[test]
    fn a_report_adds_up_by_what_was_asked_most_gpu_time_first() {
        let parts = [
            (
                holder("listen", None, "majin"),
                holding(0, HOUR_MS, 2, 8).figures(&[]),
            ),
            // A WSL2 PC: the worker takes its memory on both GPUs.
            (
                holder("voice", None, "studio"),
                holding(0, HOUR_MS, 3, 12).figures(&[]),
            ),
            (
                holder("voice", None, "studio"),
                holding(0, HOUR_MS, 3, 12).figures(&[]),
            ),
            (
                holder("glm", Some("text-router"), "atlas"),
                holding(0, HOUR_MS, 48, 96).figures(&[]),
            ),
        ];
        let by_worker = UsageReport::tally(0, HOUR_MS, Grouping::Worker, parts.clone());
        let rows: Vec<(&str, String)> = by_worker
            .rows
            .iter()
            .map(|r| (r.name.as_str(), r.gpu_hours()))
            .collect();
        assert_eq!(
            rows,
            [
                ("glm", "0.5".into()),
                ("voice", "0.5".into()),
                ("listen", "0.25".into())
            ]
        );
        assert_eq!(by_worker.total.gpu_hours(), "1.25");
        let by_group = UsageReport::tally(0, HOUR_MS, Grouping::Group, parts);
        let names: Vec<&str> = by_group.rows.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, [NO_GROUP, "text-router"]);
        assert_eq!(by_group.rows[0].gpu_hours(), "0.75");
    }

    #[test]
    fn the_csv_has_the_page_figures_and_quotes_what_it_must() {
        let report = UsageReport::tally(
            0,
            HOUR_MS,
            Grouping::Worker,
            [(
                holder("a,b", None, "m"),
                holding(0, HOUR_MS, 2, 8).figures(&[]),
            )],
        );
        assert_eq!(
            report.to_csv(),
            "worker,gpu_hours,busy_gpu_hours,energy_wh\n\"a,b\",0.25,,\nTotal,0.25,,\n"
        );
    }

    #[test]
    fn the_requests_csv_has_one_line_per_model_and_key_and_quotes_what_it_must() {
        let rows = [RequestRow {
            model: "glm-5.3".to_owned(),
            key: "ada/ci, nightly (tsr_ab12cd…)".to_owned(),
            requests: 3,
            failed: 1,
            prompt_tokens: 14,
            completion_tokens: 22,
        }];
        assert_eq!(
            requests_csv(&rows),
            "model,key,requests,failed,prompt_tokens,completion_tokens\n\
             glm-5.3,\"ada/ci, nightly (tsr_ab12cd…)\",3,1,14,22\n"
        );
    }

    #[test]
    fn groupings_are_named_in_urls() {
        for g in Grouping::ALL {
            assert_eq!(Grouping::parse(g.as_str()), Some(g));
        }
        assert_eq!(Grouping::parse("nope"), None);
    }
}
