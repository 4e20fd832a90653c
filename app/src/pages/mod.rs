//! One routed page per module.

pub mod deploy;
pub mod machine;
pub mod models;
pub mod nodes;
pub mod serving;
pub mod sharing;
pub mod usage;
