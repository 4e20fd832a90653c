//! Pieces the pages share.

pub mod account_menu;
pub mod cluster_tabs;
pub mod colour;
pub mod confirm;
pub mod estimate_panel;
pub mod live;
pub mod memory_bar;
pub mod pager;
pub mod serving_fields;
pub mod share_panel;
