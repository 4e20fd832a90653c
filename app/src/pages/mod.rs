//! One routed page per module.

pub mod admin;
pub mod audit;
pub mod deploy;
pub mod machine;
pub mod model;
pub mod models;
pub mod nodes;
pub mod overview;
pub mod playground;
pub mod repack;
pub mod serving;
pub mod sharing;
pub mod sign_in;
pub mod usage;
