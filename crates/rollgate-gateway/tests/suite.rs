//! The one integration-test binary of this crate: every file in `tests/` is
//! a module here (`autotests = false` in Cargo.toml), so the dependency graph
//! is linked once, not once per file. `rollgate-core`'s architecture test
//! checks that no file is left out.

mod common;
mod compression;
mod connections;
mod grpc;
mod it;
mod metrics;
mod pin;
mod refusals;
mod shadow;
mod stream;
mod tls;
