//! A GPU's memory as an SVG bar: one segment per sharer, then what is held outside Tessera, then what is
//! left, with a legend under it. Drawn on the server, so it reads before the wasm loads.

use crate::components::colour;
use crate::views::GpuDetail;
use leptos::prelude::*;
use placement::Bytes;

/// The bar's width in SVG units; segments are proportional to the GPU's total.
const WIDTH: u64 = 1000;

/// One segment: its label, its memory, its CSS class.
fn segments(gpu: &GpuDetail) -> Vec<(String, Bytes, String)> {
    let mut out: Vec<(String, Bytes, String)> = gpu
        .sharers
        .iter()
        .map(|s| (s.name.clone(), s.bytes, colour::of(&s.name)))
        .collect();
    if let crate::views::GpuUse::Whole(by) = &gpu.usage {
        out.push((format!("{by} (whole)"), gpu.offered(), "whole".to_owned()));
    }
    if gpu.held_outside > Bytes::ZERO {
        out.push((
            "held outside Tessera".to_owned(),
            gpu.held_outside,
            "outside".to_owned(),
        ));
    }
    out
}

/// The bar of one GPU.
#[component]
pub fn MemoryBar(
    /// The GPU.
    gpu: GpuDetail,
) -> impl IntoView {
    let total = gpu.total.get().max(1);
    let parts = segments(&gpu);
    let used: Bytes = parts.iter().map(|(_, b, _)| *b).sum();
    let left = gpu.total.saturating_sub(used);
    let label = {
        let mut words: Vec<String> = parts.iter().map(|(n, b, _)| format!("{n} {b}")).collect();
        words.push(format!("{left} left"));
        format!(
            "GPU {} memory, {}: {}",
            gpu.index,
            gpu.total,
            words.join(", ")
        )
    };
    let legend = parts
        .iter()
        .map(|(name, bytes, class)| (name.clone(), bytes.to_string(), class.clone()))
        .chain(std::iter::once(("left".to_owned(), left.to_string(), "left".to_owned())))
        .map(|(name, bytes, class)| {
            view! { <li><span class=format!("swatch {class}") aria-hidden="true"></span>{format!("{name} {bytes}")}</li> }
        })
        .collect_view();
    let mut x = 0u64;
    let rects = parts
        .into_iter()
        .map(|(name, bytes, class)| {
            let width = (u128::from(bytes.get()) * u128::from(WIDTH) / u128::from(total)) as u64;
            let at = x;
            x += width;
            view! {
                <rect class=format!("seg {class}") x=at y="0" width=width.max(2) height="28">
                    <title>{format!("{name} {bytes}")}</title>
                </rect>
            }
        })
        .collect_view();
    view! {
        <svg
            class="memory-bar"
            viewBox=format!("0 0 {WIDTH} 28")
            preserveAspectRatio="none"
            role="img"
            aria-label=label
            data-testid="memory-bar"
        >
            <rect class="seg left" x="0" y="0" width=WIDTH height="28"></rect>
            {rects}
        </svg>
        <ul class="legend" aria-hidden="true" data-testid="memory-legend">{legend}</ul>
    }
}
