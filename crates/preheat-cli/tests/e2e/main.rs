//! The CLI's end-to-end tests in one binary: the real `preheat` on real servers, files and
//! processes. One binary instead of one per file links once and lets the test harness run the
//! files' tests side by side on both CPUs (tests that must run alone take `common::serial`;
//! tests that depend on the machine's timing live in `timing` modules, run by the suite's
//! second pass one at a time). `architecture.rs` stays a binary of its own: it reads the tree,
//! not the machine.

mod common;

mod affinity;
mod any_server;
mod cli;
mod comm;
mod cosched;
mod cosim;
mod groups;
mod guest;
mod hybrid;
mod lab;
mod load;
mod netns;
mod preflight;
mod probe_accuracy;
mod readme;
mod run_auto;
mod runtimes;
mod stopping;
