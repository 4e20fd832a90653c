//! The scheduler's tests, one room per behaviour; here only the set-up they share: a fleet, requests, and
//! reading a decision as placed or waiting.

mod committed;
mod mps;
mod placing;
mod properties;

use super::*;
use crate::request::RequestedResources;

fn fleet(machines: Vec<Machine>) -> Scheduler {
    Scheduler::new(Inventory::new(machines).unwrap())
}

fn shared(gb: f64) -> WorkerRequest {
    WorkerRequest::shared_gb(gb)
}

fn request(json: &str) -> WorkerRequest {
    let wire: RequestedResources = serde_json::from_str(json).unwrap();
    WorkerRequest::from_wire(&wire).unwrap()
}

fn placed(d: Result<Decision, ScheduleError>) -> Assignment {
    match d.unwrap() {
        Decision::Place(a) => a,
        Decision::Wait(r) => panic!("expected a placement, got {r:?}"),
    }
}

fn waits(d: Result<Decision, ScheduleError>) -> Vec<String> {
    match d.unwrap() {
        Decision::Wait(r) => r.iter().map(ToString::to_string).collect(),
        Decision::Place(a) => panic!("expected to wait, got {a:?}"),
    }
}

fn shared_on(machine: &str, index: u32, gb: f64) -> Assignment {
    Assignment {
        machine: machine.into(),
        gpus: vec![index],
        shared: Some(Bytes::from_gb(gb).unwrap()),
        cpu_cores: 0,
        memory: Bytes::ZERO,
    }
}
