//! Order statistics with distribution-free 95% confidence intervals: the shared implementation in
//! [`preheat_model::stats`].

pub use preheat_model::stats::{summarize, Summary};
