//! One routed page per module.

pub mod share_plan;
