//! The one integration-test binary of this crate: every file in `tests/` is
//! a module here (`autotests = false` in Cargo.toml), so the dependency graph
//! is linked once, not once per file. `rollgate-core`'s architecture test
//! checks that no file is left out.

mod architecture;
mod golden;
mod quality;
mod rollout;
mod rollout_sequential;
mod rollout_steps;
mod tidy;
mod watch;
