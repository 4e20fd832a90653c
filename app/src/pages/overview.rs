//! The Overview: the page a person opens first, at any size. The fleet's GPUs and what their memory is
//! doing, the models and how they are, the gateway's last clock hour, and every open alarm, each a link to
//! the page where it is dealt with.

use crate::components::live::use_live;
use crate::error::AppError;
use crate::views::{Alarm, Overview};
use leptos::prelude::*;
use leptos_meta::Title;
use leptos_router::components::A;
use placement::{BasisPoints, Bytes};

/// The fleet at a glance.
#[server(prefix = "/rpc", endpoint = "load_overview", client = crate::csrf::CsrfClient)]
pub async fn load_overview() -> Result<Overview, AppError> {
    crate::auth::require(crate::auth::Role::Viewer)?;
    let console = crate::services::console()?;
    crate::services::answer(console.overview()).await
}

/// A count as operators read it at size: `10,013`.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The tab's title: the open alarms counted first, so that a tab in the background says so.
fn title(alarms: usize) -> String {
    match alarms {
        0 => "Overview".to_owned(),
        n => format!("({n}) Overview"),
    }
}

/// The fleet's memory as one stacked bar (shared, whole GPUs, held outside, free), with its legend: one
/// element whatever the fleet's size.
#[component]
fn FleetBar(o: Overview) -> impl IntoView {
    const WIDTH: u64 = 1000;
    let total = o.total.get().max(1);
    let parts = [
        ("shared", "Shared", o.shared),
        ("whole", "Whole GPUs", o.whole),
        ("outside", "Outside Tessera", o.outside),
        ("unused", "Free", o.free),
    ];
    let label = parts
        .iter()
        .map(|(_, name, bytes)| format!("{name} {}", bytes.size_text()))
        .collect::<Vec<_>>()
        .join(", ");
    let mut x = 0;
    let rects = parts
        .iter()
        .map(|(class, name, bytes)| {
            let width = (u128::from(bytes.get()) * u128::from(WIDTH) / u128::from(total)) as u64;
            let at = x;
            x += width;
            view! { <rect class=format!("seg {class}") x=at y="0" width=width height="28"><title>{format!("{name} {}", bytes.size_text())}</title></rect> }
        })
        .collect_view();
    let legend = parts
        .iter()
        .map(|(class, name, bytes)| view! {
            <li><span class=format!("swatch {class}") aria-hidden="true"></span>{format!("{name} {}", with_share(*bytes, o.total))}</li>
        })
        .collect_view();
    view! {
        <svg class="memory-bar fleet" viewBox=format!("0 0 {WIDTH} 28") preserveAspectRatio="none" role="img"
            aria-label=format!("The fleet's GPU memory, {}: {label}", o.total.size_text()) data-testid="fleet-bar">
            <rect class="seg left" x="0" y="0" width=WIDTH height="28"></rect>
            {rects}
        </svg>
        <ul class="legend" aria-hidden="true">{legend}</ul>
    }
}

/// `part` of `whole` as the page says it: `12.5 GB (41%)`.
fn with_share(part: Bytes, whole: Bytes) -> String {
    format!(
        "{} ({}%)",
        part.size_text(),
        BasisPoints::ratio(part, whole).get() / 100
    )
}

/// The line under the memory figures: how much of the free memory lies in fragments.
fn stranded_line(o: &Overview) -> Option<String> {
    (o.stranded > Bytes::ZERO).then(|| {
        format!(
            "{} of the free memory lies in fragments on GPUs that are partly shared: a repack can gather it into whole GPUs.",
            o.stranded.size_text()
        )
    })
}

/// The models' line: `7 models: 5 serving, 1 loading, 1 not loaded, 0 failing`.
fn models_line(o: &Overview) -> String {
    format!(
        "{} model{}: {} serving, {} loading, {} not loaded, {} failing",
        o.models,
        if o.models == 1 { "" } else { "s" },
        o.serving,
        o.loading,
        o.idle,
        o.failing
    )
}

/// The gateway's line: `1,204 requests since 09:00 UTC, 3 failed (0.2%)`.
fn gateway_line(o: &Overview) -> String {
    let since = o.since.get(11..16).unwrap_or(&o.since);
    let failed_percent = if o.requests == 0 {
        0.0
    } else {
        o.failed_requests as f64 * 100.0 / o.requests as f64
    };
    format!(
        "{} request{} since {since} UTC, {} failed ({failed_percent:.1}%)",
        thousands(o.requests),
        if o.requests == 1 { "" } else { "s" },
        thousands(o.failed_requests)
    )
}

/// The page.
#[component]
pub fn OverviewPage() -> impl IntoView {
    let live = use_live();
    let overview = Resource::new(move || live.track(), |_| load_overview());
    view! {
        <div class="page">
            <h1>"Overview"</h1>
            <Transition fallback=|| view! { <p>"Reading the fleet…"</p> }>
                {move || overview.get().map(|answer| match answer {
                    Ok(o) => view! { <OverviewPanels o /> }.into_any(),
                    Err(e) => view! { <p class="error" role="alert">{e.to_string()}</p> }.into_any(),
                })}
            </Transition>
        </div>
    }
}

#[component]
fn OverviewPanels(o: Overview) -> impl IntoView {
    let alarms = o.alarms.clone();
    view! {
        <Title text=title(o.alarm_count as usize) />
        <section class="panel" aria-labelledby="overview-alarms" data-testid="alarms">
            <h2 id="overview-alarms">"Alarms"</h2>
            {if alarms.is_empty() {
                view! { <p class="muted" data-testid="no-alarms">"No alarms."</p> }.into_any()
            } else {
                view! {
                    <ul class="alarms">
                        {alarms.into_iter().map(|a: Alarm| view! {
                            <li data-testid="alarm" data-kind=format!("{:?}", a.kind)>
                                <span class="chip bad">{a.kind.label()}</span>" "
                                <A href=a.href>{a.line}</A>
                            </li>
                        }).collect_view()}
                    </ul>
                }.into_any()
            }}
        </section>
        <section class="panel" aria-labelledby="overview-gpus">
            <h2 id="overview-gpus">"GPUs"</h2>
            <dl class="figures" data-testid="gpu-figures">
                <div><dt>"Machines"</dt><dd data-testid="machines">{thousands(o.machines.into())}</dd></div>
                <div><dt>"GPUs"</dt><dd data-testid="gpus">{thousands(o.gpus.into())}</dd></div>
                <div><dt>"Free GPUs"</dt><dd data-testid="free-gpus">{thousands(o.free_gpus.into())}</dd></div>
                <div><dt>"Memory"</dt><dd data-testid="memory">{o.total.size_text()}</dd></div>
            </dl>
            <FleetBar o=o.clone() />
            <dl class="figures" data-testid="memory-figures">
                <div><dt>"Shared"</dt><dd data-testid="shared">{with_share(o.shared, o.total)}</dd></div>
                <div><dt>"Whole GPUs"</dt><dd data-testid="whole">{with_share(o.whole, o.total)}</dd></div>
                <div><dt>"Free"</dt><dd data-testid="free">{with_share(o.free, o.total)}</dd></div>
                <div><dt>"Outside Tessera"</dt><dd data-testid="outside">{with_share(o.outside, o.total)}</dd></div>
            </dl>
            {stranded_line(&o).map(|line| view! {
                <p data-testid="stranded">{line}" "<A href="/repack">"Repack"</A></p>
            })}
            {(o.unreachable > 0).then(|| view! {
                <p class="warn" data-testid="unreachable">{format!("{} of the {} machines are unreachable.", o.unreachable, o.machines)}</p>
            })}
            <p><A href="/nodes">"Nodes"</A></p>
        </section>
        <section class="panel" aria-labelledby="overview-models">
            <h2 id="overview-models">"Models"</h2>
            <p data-testid="models-line">{models_line(&o)}</p>
            <p><A href="/models">"Models"</A>" · "<A href="/deploy">"Deploy Model"</A></p>
        </section>
        <section class="panel" aria-labelledby="overview-gateway">
            <h2 id="overview-gateway">"Gateway"</h2>
            <p data-testid="gateway-line">{gateway_line(&o)}</p>
            <p><A href="/usage">"Usage"</A>" · "<A href="/playground">"Playground"</A></p>
        </section>
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_written_with_thousands_separators_and_alarms_lead_the_title() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1254), "1,254");
        assert_eq!(thousands(10_013), "10,013");
        assert_eq!(thousands(1_000_000), "1,000,000");
        assert_eq!(title(0), "Overview");
        assert_eq!(title(3), "(3) Overview");
    }

    fn overview() -> Overview {
        Overview {
            machines: 4,
            unreachable: 0,
            gpus: 12,
            free_gpus: 3,
            total: Bytes::gb(800),
            shared: Bytes::gb(200),
            whole: Bytes::gb(160),
            outside: Bytes::gb(8),
            free: Bytes::gb(432),
            stranded: Bytes::gb(64),
            models: 7,
            serving: 5,
            loading: 1,
            idle: 1,
            failing: 0,
            requests: 1204,
            failed_requests: 3,
            since: "2026-12-05T09:00:00Z".into(),
            alarms: Vec::new(),
            alarm_count: 0,
        }
    }

    #[test]
    fn the_figures_read_as_sentences_a_person_would_say() {
        let o = overview();
        assert_eq!(with_share(o.shared, o.total), "200 GB (25%)");
        assert_eq!(
            models_line(&o),
            "7 models: 5 serving, 1 loading, 1 not loaded, 0 failing"
        );
        assert_eq!(
            gateway_line(&o),
            "1,204 requests since 09:00 UTC, 3 failed (0.2%)"
        );
        assert_eq!(
            stranded_line(&o).unwrap(),
            "64 GB of the free memory lies in fragments on GPUs that are partly shared: a repack can gather it into whole GPUs."
        );
        let none = Overview {
            stranded: Bytes::ZERO,
            requests: 0,
            failed_requests: 0,
            ..overview()
        };
        assert_eq!(stranded_line(&none), None);
        assert_eq!(
            gateway_line(&none),
            "0 requests since 09:00 UTC, 0 failed (0.0%)"
        );
    }
}
