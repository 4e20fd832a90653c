//! Best fit at fleet scale: one decision among 10,000 GPUs, and 100,000 placements onto them.

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
mod support;

use placement::{Bytes, Decision, Inventory, Scheduler, WorkerRequest};
use std::hint::black_box;
use std::time::Duration;

/// 1,250 machines of 8 GPUs of 80 GB: 10,000 GPUs.
fn fleet() -> Inventory {
    support::h100s(1250, "node-", 1024, Bytes::gb(4096), |index| {
        Bytes::gb(u64::from(index % 3))
    })
}

/// Worker sizes from 0.5 to 7.5 GB, varied so the fleet fills unevenly.
fn size(n: usize) -> f64 {
    0.5 + (n * 37 % 15) as f64 / 2.0
}

fn best_fit(c: &mut Criterion) {
    let mut half_full = Scheduler::new(fleet());
    for n in 0..40_000 {
        half_full
            .place(&format!("w{n}"), &WorkerRequest::shared_gb(size(n)))
            .expect("a fresh name");
    }
    let request = WorkerRequest::shared_gb(2.5);
    c.bench_function("one best-fit decision among 10,000 GPUs", |b| {
        b.iter(|| {
            assert!(matches!(
                black_box(&half_full).decide(black_box(&request)),
                Decision::Place(_)
            ))
        })
    });

    let requests: Vec<(String, WorkerRequest)> = (0..100_000)
        .map(|n| (format!("w{n}"), WorkerRequest::shared_gb(size(n))))
        .collect();
    let mut group = c.benchmark_group("fleet");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(20));
    group.bench_function("100,000 placements onto 10,000 GPUs", |b| {
        b.iter_batched(
            || Scheduler::new(fleet()),
            |mut s| {
                for (name, request) in &requests {
                    assert!(matches!(s.place(name, request), Ok(Decision::Place(_))));
                }
                s
            },
            BatchSize::PerIteration,
        )
    });
    group.finish();
}

criterion_group!(benches, best_fit);
criterion_main!(benches);
