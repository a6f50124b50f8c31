//! The one integration-test binary of this crate: every file in `tests/` is
//! a module here (`autotests = false` in Cargo.toml), so the dependency graph
//! is linked once, not once per file. `rollgate-core`'s architecture test
//! checks that no file is left out.

mod cli;
mod common;
mod dashboard;
mod data_plane;
mod e2e;
mod few_keys;
mod ha;
mod host;
mod kubernetes;
mod labels;
mod late_labels;
mod manifests;
mod mlflow;
mod mlserver;
mod notify;
mod openapi;
mod operator;
mod payloads;
mod prometheus;
mod store_outage;
mod tls;
