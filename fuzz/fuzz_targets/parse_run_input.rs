//! Fuzz target: parse + validate of an untrusted `POST /api/v1/agent/runs` body.
//! Run: `RUSTC_BOOTSTRAP=1 cargo fuzz run parse_run_input -- -max_total_time=60`
//! (see docs/testing.md).
#![no_main]

use libfuzzer_sys::fuzz_target;
use switchboard_protocol::validate::parse_run_input;

fuzz_target!(|body: &[u8]| {
    if let Ok(input) = parse_run_input(body) {
        // Whatever is accepted must serialise and be accepted again, unchanged.
        let again = serde_json_round_trip(&input);
        assert_eq!(again.as_ref(), Some(&input));
    }
});

fn serde_json_round_trip(
    input: &switchboard_protocol::RunAgentInput,
) -> Option<switchboard_protocol::RunAgentInput> {
    let bytes = serde_json::to_vec(input).ok()?;
    parse_run_input(&bytes).ok()
}
