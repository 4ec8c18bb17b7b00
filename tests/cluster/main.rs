//! What `serve` and `nodes` do with a cluster, against fake API servers that answer as the recordings show: scheduling gates, leader election, namespace policy, node pools, scale and taints, the cluster flags.
//!
//! One test binary for these (each binary links the whole crate: a few binaries build far
//! faster than one per file); each module is one file of tests, named by what it exercises.

#[path = "../common/mod.rs"]
mod common;

mod cluster_flags;
mod crash_actions;
mod crashes;
mod crashes_learned;
mod fake_api;
mod gates;
mod leader_election;
mod namespace_policy;
mod node_pools;
mod node_scale;
mod node_taints;
