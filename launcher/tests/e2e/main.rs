//! The end-to-end tests, one module per behaviour, in one test binary: one link
//! instead of one per file (`scripts/bench/bench_test_layout.sh` measured it). The suites
//! that need the machine to themselves (`straggler_e2e`, `pytorch_launcher_suite`)
//! and the start-up benchmark stay binaries of their own, which cargo runs alone.
//! One module: `cargo test -p toporun --test e2e -- elastic_e2e::`.

#[path = "../support/mod.rs"]
mod support;

mod bench_rendezvous_e2e;
mod broken_pipe_e2e;
mod cloud_metadata_e2e;
mod colocation_e2e;
mod console_backpressure_e2e;
mod docs_e2e;
mod dry_run_e2e;
mod elastic_e2e;
mod exit_code_docs;
mod faults_e2e;
mod first_cause_e2e;
mod gate_e2e;
mod hang_e2e;
mod harness;
mod help_e2e;
mod hostile_input_e2e;
mod interpreter_e2e;
mod json_documents_e2e;
mod launch_e2e;
mod local_exposure_e2e;
mod lost_peer_e2e;
mod manifests_e2e;
mod module_graph;
mod nccl_log_e2e;
mod nccl_report_e2e;
mod network_check_e2e;
mod preemption_e2e;
mod preflight_e2e;
mod rendezvous_e2e;
mod rendezvous_faults_e2e;
mod root_cause_e2e;
mod source_sizes;
mod status_endpoint_e2e;
mod store_attacks_e2e;
mod store_port_e2e;
mod terminal_e2e;
mod torchrun_parity_e2e;
