//! The Shared GPU memory panel of seed 003: a bar, one share field per member, the total and the Free row,
//! and the verdict, all recomputed in the browser on every keystroke.

use crate::components::colour;
use crate::share_form::{verdict_lines, ShareRow};
use leptos::prelude::*;
use placement::{BasisPoints, Bytes, Verdict};

/// The bar's width in SVG units.
const BAR_WIDTH: u64 = 1000;

/// The panel. It edits `rows` in place; its parent owns the verdict so that it can gate Deploy or Save.
#[component]
pub fn SharedGpuMemoryPanel(
    /// The members' rows, in display order. The set of members is fixed while the panel is open.
    rows: RwSignal<Vec<ShareRow>>,
    /// `placement`'s verdict on the rows.
    #[prop(into)]
    verdict: Signal<Verdict>,
    /// One GPU's memory, to show each share in GB.
    gpu_total: Bytes,
) -> impl IntoView {
    let count = rows.with_untracked(Vec::len);
    let fields = (0..count)
        .map(|i| {
            let name = rows.with_untracked(|r| r[i].name.clone());
            let locked = rows.with_untracked(|r| r[i].locked);
            let id = format!("share-{i}");
            let text = move || rows.with(|r| r[i].text.clone());
            let error = move || rows.with(|r| r[i].field_error());
            let gb = move || rows.with(|r| r[i].member().share.map(|s| gpu_total.share(s).gb_text()));
            let problem = move || verdict.with(|v| v.problems.iter().any(|p| p.member() == Some(name.as_str())));
            let below = move || rows.with(|r| r[i].below_estimate(gpu_total));
            let estimate = move || rows.with(|r| r[i].estimate).map(|e| format!(" · needs {}", e.size_text()));
            let label = rows.with_untracked(|r| r[i].name.clone());
            view! {
                <tr data-testid="share-row" class:problem=problem class:below-estimate=below>
                    <th scope="row">
                        // The swatch ties the row to its segment of the bar, in the model's colour everywhere.
                        <span class=format!("swatch {}", colour::of(&label)) aria-hidden="true"></span>
                        <label for=id.clone()>{label.clone()}</label>
                        {locked.then(|| view! { <span class="tag" data-testid="not-editable">"not editable"</span> })}
                    </th>
                    <td>
                        <input
                            id=id
                            type="text"
                            inputmode="decimal"
                            autocomplete="off"
                            size="6"
                            aria-label=format!("GPU memory share of {label}, percent")
                            readonly=locked
                            aria-readonly=locked.then_some("true")
                            prop:value=text
                            on:input=move |ev| {
                                if !locked {
                                    let value = event_target_value(&ev);
                                    rows.update(|r| r[i].text = value);
                                }
                            }
                        />
                        "%"
                        <span class="field-error" role="alert">{error}</span>
                    </td>
                    <td class="gb" data-testid="share-gb">{move || gb().map(|gb| format!("{gb} GB"))}{estimate}</td>
                    <td class="demand">
                        {(!locked).then(|| {
                            let demand_id = format!("on-demand-{i}");
                            let keep_id = format!("keep-alive-{i}");
                            let on = move || rows.with(|r| r[i].on_demand);
                            let keep = move || rows.with(|r| r[i].keep_alive.clone());
                            let keep_error = move || rows.with(|r| r[i].keep_alive_error());
                            view! {
                                <input
                                    id=demand_id.clone()
                                    type="checkbox"
                                    data-testid="on-demand"
                                    aria-label=format!("Load {label} on demand")
                                    prop:checked=on
                                    on:change=move |ev| {
                                        let checked = event_target_checked(&ev);
                                        rows.update(|r| r[i].on_demand = checked);
                                    }
                                />
                                <label for=demand_id>"on demand"</label>
                                <span hidden=move || !on()>
                                    ", unloaded after "
                                    <input
                                        id=keep_id
                                        type="text"
                                        inputmode="numeric"
                                        autocomplete="off"
                                        size="6"
                                        data-testid="keep-alive"
                                        aria-label=format!("Keep-alive of {label} with no request, seconds")
                                        prop:value=keep
                                        on:input=move |ev| {
                                            let value = event_target_value(&ev);
                                            rows.update(|r| r[i].keep_alive = value);
                                        }
                                    />
                                    " s idle"
                                    <span class="field-error" role="alert">{keep_error}</span>
                                </span>
                            }
                        })}
                    </td>
                </tr>
            }
        })
        .collect_view();

    // SVG rather than styled boxes: the page's Content Security Policy allows no inline styles. On-demand
    // members take turns: the bar shows the room they take turns in once, as large as the largest of them.
    // Over 100 % the bar grows past the GPU's end: its end is marked and what lies past it is red.
    let scale = move || verdict.with(|v| v.total.max(BasisPoints::WHOLE));
    let at = move |share: BasisPoints| {
        u64::from(share.get()) * BAR_WIDTH / u64::from(scale().get().max(1))
    };
    let segments = move || {
        rows.with(|r| {
            let pinned = r
                .iter()
                .filter(|row| !row.on_demand && row.replicas.is_none());
            let turn_share = r
                .iter()
                .filter(|row| row.on_demand)
                .filter_map(|row| row.member().share)
                .max();
            let turn = turn_share.map(|s| ("on-demand turns".to_owned(), s, "turns".to_owned(), None));
            // Replicas run on some GPUs, not all: the bar shows the most they put on one, once.
            let beside: u32 = pinned
                .clone()
                .filter_map(|row| row.member().share)
                .chain(turn_share)
                .map(BasisPoints::get)
                .sum();
            let replicas = r
                .iter()
                .any(|row| row.replicas.is_some())
                .then(|| verdict.with(|v| v.total.get().saturating_sub(beside)))
                .filter(|&room| room > 0)
                .map(|room| {
                    (
                        "replicas, the most on one GPU".to_owned(),
                        BasisPoints(room),
                        "turns".to_owned(),
                        None,
                    )
                });
            let shares: Vec<(String, BasisPoints, String, Option<Bytes>)> = pinned
                .filter_map(|row| {
                    let share = row.member().share?;
                    Some((row.name.clone(), share, colour::of(&row.name), row.estimate))
                })
                .chain(turn)
                .chain(replicas)
                .collect();
            let mut x = 0u64;
            shares
                .into_iter()
                .map(|(name, share, class, estimate)| {
                    let width = at(share);
                    let start = x;
                    x += width;
                    // Where the member's estimate ends, on its own segment.
                    let mark = estimate.map(|e| start + at(BasisPoints::ratio(e, gpu_total)));
                    view! {
                        <g class=format!("segment {class}")>
                            <rect x=start y="0" width=width height="32"><title>{format!("{name} {share}")}</title></rect>
                            {mark.map(|m| view! {
                                <line class="estimate-mark" x1=m x2=m y1="0" y2="32"><title>{format!("{name}'s estimate")}</title></line>
                            })}
                        </g>
                    }
                })
                .collect_view()
        })
    };
    let over = move || verdict.with(|v| v.total.over());
    let overflow = move || {
        over().map(|_| {
            let limit = at(BasisPoints::WHOLE);
            view! {
                <rect class="overflow" x=limit y="0" width=BAR_WIDTH - limit height="32"><title>"past the GPU's memory"</title></rect>
                <line class="limit" x1=limit x2=limit y1="0" y2="32"></line>
            }
        })
    };
    let over_line = move || {
        over().map(|by| {
            format!(
                "Over by {by} of the GPU ({} GB): the red part of the bar does not fit.",
                gpu_total.share(by).gb_text()
            )
        })
    };

    let total = move || verdict.with(|v| v.total.to_string());
    let free = move || {
        verdict.with(|v| match v.total.over() {
            Some(by) => format!("none: over by {by}"),
            None => v.free().to_string(),
        })
    };
    let warns = move || verdict.with(Verdict::warns);
    let refused = move || verdict.with(Verdict::is_refused);
    let lines = move || {
        verdict
            .with(verdict_lines)
            .into_iter()
            .map(|line| view! { <li>{line}</li> })
            .collect_view()
    };

    view! {
        <section class="panel" aria-labelledby="shared-gpu-memory">
            <h2 id="shared-gpu-memory">"Shared GPU memory"</h2>
            <svg class="bar" viewBox=format!("0 0 {BAR_WIDTH} 32") preserveAspectRatio="none" role="img" aria-label=move || format!("Shares of one accelerator: {} taken, {} free", total(), free())>
                <rect class="left" x="0" y="0" width=BAR_WIDTH height="32"></rect>
                {segments}
                {overflow}
            </svg>
            {move || over_line().map(|line| view! { <p class="over-by" data-testid="over-by">{line}</p> })}
            <table class="shares">
                <colgroup><col class="name" /><col class="share" /><col class="gb" /><col /></colgroup>
                <thead>
                    <tr>
                        <th scope="col">"Model"</th>
                        <th scope="col">"GPU memory share"</th>
                        <th scope="col">"Memory"</th>
                        <th scope="col">"Loading"</th>
                    </tr>
                </thead>
                <tbody>
                    {fields}
                    <tr class="total">
                        <th scope="row">"Total"</th>
                        <td data-testid="total">{total}</td>
                        <td></td>
                        <td></td>
                    </tr>
                    <tr class="free" class:warn=warns>
                        <th scope="row">"Free"</th>
                        <td data-testid="free" class:over=move || over().is_some()>{free}</td>
                        <td data-testid="free-warning" colspan="2">{move || warns().then_some(placement::plan::FREE_ROW_WARNING)}</td>
                    </tr>
                </tbody>
            </table>
            <ul class="verdict" class:refused=refused data-testid="verdict" aria-live="polite">
                {lines}
            </ul>
        </section>
    }
}
