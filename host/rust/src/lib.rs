//! lockmq's compiled core (`lockmq._core`): the per-batch hot paths of the broker's
//! protocol, store codec and consumer side, under a PyO3 binding (`binding.rs`).
//!
//! The pure-Python code each function mirrors stays the reference, and what
//! MicroPython runs; the tests hold the two equal on vectors and random or damaged
//! input. The parsers here take only what they fully understand and leave every other
//! input to the Python decoder, which raises the protocol's own errors.
//! `lockmq.accel` picks this core or pure Python once per process (a version check
//! of the whole module, `API`).

pub mod bytes;
pub mod checksum;
pub mod consts;
pub mod frame;
pub mod mac;
pub mod messages;
pub mod records;

#[cfg(feature = "python")]
mod binding;
#[cfg(feature = "python")]
mod lane;

/// The interface version `lockmq.accel` checks: bumped whenever a function's
/// signature or meaning changes, so a stale build is never half used.
pub const API: u32 = 1;
