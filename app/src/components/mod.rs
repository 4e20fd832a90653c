//! Pieces the pages share.

pub mod share_panel;
