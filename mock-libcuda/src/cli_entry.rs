//! Glue between the export table's command-line slot and [`crate::cli`]: opens the world,
//! applies the scripted `cuda-checkpoint` faults, records the invocation in the trace, and runs
//! the generation of the command line the world's driver serves.

use crate::driver::{self, RealDriver};
use crate::world::config::FaultAction;
use abi::CUresult;
use std::io::Write;

/// Runs one `cuda-checkpoint` command line; returns its exit status.
pub fn run_command_line(args: &[String]) -> i32 {
    let w = match driver::world() {
        Ok(w) => w,
        Err(code) => {
            eprintln!(
                "Error initializing CUDA: \"{}\"",
                code.description().unwrap_or("unknown error")
            );
            return i32::from(code.exit_status());
        }
    };
    let generation = w.config().driver.cli_generation();
    let (functions, pid) = crate::cli::fault_key(args, generation);
    let target = pid.and_then(crate::ffi::sys::tgid_of).or(pid);
    let fault = w.fault_for(&functions, target).ok().flatten();
    let mut after: Option<CUresult> = None;
    let status = 'run: {
        if let Some(action) = &fault {
            match action {
                FaultAction::Garbage { text, status } => {
                    print!("{text}");
                    let _ = std::io::stdout().flush();
                    break 'run *status;
                }
                FaultAction::Return { code } => break 'run injected(code.cuda()),
                FaultAction::ErrorAfter { code } => after = Some(code.cuda()),
                other => {
                    if let Err(code) = driver::apply_fault(&w, other, target, || Ok(())) {
                        break 'run injected(code);
                    }
                }
            }
        }
        let stdout = std::io::stdout();
        let stderr = std::io::stderr();
        let status = crate::cli::run(
            args,
            generation,
            &RealDriver,
            &mut stdout.lock(),
            &mut stderr.lock(),
        );
        match after {
            Some(code) => injected(code),
            None => status,
        }
    };
    w.trace(
        "cuda-checkpoint",
        &args.iter().skip(1).cloned().collect::<Vec<_>>().join(" "),
        &format!("exit={status}"),
    );
    status
}

/// Reports an injected failure the way the utility reports a failing driver call (the code's
/// description, quoted) and returns its exit status.
fn injected(code: CUresult) -> i32 {
    eprintln!("Error: injected fault: \"{}\"", crate::cli::describe(code));
    i32::from(code.exit_status())
}
