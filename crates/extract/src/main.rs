//! `switchboard-extract`: extracts one attachment in a process of its own, for the
//! worker (see `extract::isolate`). Reads a request from standard input, confines
//! itself as the request says before reading the file, writes the reply to standard
//! output. A file that needs more memory than allowed ends this process (allocation
//! failure aborts), never the worker.

use std::io;
use std::process::ExitCode;

use extract::isolate::{Request, serve};
use rustix::process::{Resource, Rlimit, Signal, set_parent_process_death_signal, setrlimit};

/// Seconds of CPU allowed beyond the extraction's own timeout before the kernel stops
/// the process (the worker kills it at its deadline first; this covers a dead worker).
const CPU_GRACE_SECS: u64 = 3;

fn limit(resource: Resource, value: u64) -> io::Result<()> {
    setrlimit(
        resource,
        Rlimit {
            current: Some(value),
            maximum: Some(value),
        },
    )
    .map_err(io::Error::from)
}

/// Dies with the worker, dumps no core, can gain no privilege (no setuid binary, no file
/// capability), and stays within the request's memory and time.
fn confine(request: &Request) -> io::Result<()> {
    set_parent_process_death_signal(Some(Signal::KILL)).map_err(io::Error::from)?;
    rustix::thread::set_no_new_privs(true).map_err(io::Error::from)?;
    limit(Resource::Core, 0)?;
    let cpu = request.limits.timeout.as_secs() + 1 + CPU_GRACE_SECS;
    limit(Resource::Cpu, cpu)?;
    if request.memory_bytes > 0 {
        limit(Resource::As, request.memory_bytes)?;
    }
    Ok(())
}

fn main() -> ExitCode {
    let mut input = io::stdin().lock();
    let mut output = io::stdout().lock();
    match serve(&mut input, &mut output, confine) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("switchboard-extract: {error}");
            ExitCode::from(2)
        }
    }
}
