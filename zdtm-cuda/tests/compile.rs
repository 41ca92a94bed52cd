//! Compiles every workload with nvcc (from $NVCC, PATH, /usr/local/cuda or the wheel toolchain of
//! scripts/zdtm-cuda-toolchain.sh) and runs each binary once without CRIU: without a GPU each must
//! skip itself (exit 77, a SKIP line in its status file); with one it must reach READY and PASS
//! after SIGUSR1. Skips with the reason when there is no nvcc (fails instead with
//! ZDTM_CUDA_REQUIRE_NVCC=1, as CI sets it).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use zdtm_cuda::report::Outcome;
use zdtm_cuda::runner::{parse_status, verdict, Exit};
use zdtm_cuda::toolchain::{self, NvccLookup, DEFAULT_ARCHS};
use zdtm_cuda::workloads::{self, EXIT_SKIP};

#[test]
fn every_workload_compiles_and_follows_the_protocol() {
    let nvcc = match toolchain::find_nvcc(&NvccLookup::from_env()) {
        Ok(n) => n,
        Err(e) => {
            assert!(
                std::env::var_os("ZDTM_CUDA_REQUIRE_NVCC").is_none_or(|v| v != "1"),
                "ZDTM_CUDA_REQUIRE_NVCC=1 but {e}"
            );
            eprintln!("SKIP compile test: {e}");
            return;
        }
    };
    let out = tempfile::tempdir().unwrap();
    let jobs = std::thread::available_parallelism().map_or(1, usize::from);
    let r = toolchain::build(&nvcc.path, out.path(), DEFAULT_ARCHS, jobs, workloads::ALL)
        .unwrap_or_else(|e| match e {
            toolchain::ToolchainError::Compile { logs, .. } => {
                panic!(
                    "{}",
                    logs.iter()
                        .map(|(n, l)| format!("--- {n}\n{l}"))
                        .collect::<String>()
                )
            }
            e => panic!("{e}"),
        });
    eprintln!(
        "compiled {} workloads with {} ({}) for sm_{:?} with {jobs} job(s) in {:.1} s",
        r.built.len(),
        nvcc.path.display(),
        nvcc.source.label(),
        DEFAULT_ARCHS,
        r.elapsed.as_secs_f64()
    );
    for b in &r.built {
        eprintln!("  {:<16} {:.1} s", b.name, b.elapsed.as_secs_f64());
        assert!(
            b.output.is_empty(),
            "{}: nvcc warnings:\n{}",
            b.name,
            b.output
        );
        protocol(&b.binary, out.path());
    }
}

/// Runs one workload without CRIU: SKIP (no GPU), or READY then PASS after SIGUSR1.
fn protocol(bin: &Path, dir: &Path) {
    let name = bin.file_name().unwrap().to_string_lossy().into_owned();
    let status = dir.join(format!("{name}.status"));
    let mut child = Command::new(bin)
        .arg(format!("--status={}", status.display()))
        .env("ZDTM_CUDA_MIB", "4")
        .env("ZDTM_CUDA_TIMEOUT", "120")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let t = Instant::now();
    let mut signalled = false;
    let code = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s.code().unwrap_or(-1);
        }
        let st = parse_status(&std::fs::read_to_string(&status).unwrap_or_default());
        if st.ready.is_some() && !signalled {
            let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
            nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGUSR1).unwrap();
            signalled = true;
        }
        assert!(t.elapsed() < Duration::from_secs(180), "{name}: no verdict");
        std::thread::sleep(Duration::from_millis(20));
    };
    let st = parse_status(&std::fs::read_to_string(&status).unwrap());
    let v = verdict(&st, Exit::Code(code));
    eprintln!("    {name}: exit {code}, {v:?}");
    match v {
        Outcome::Pass => assert!(signalled, "{name}: PASS without READY"),
        Outcome::Skip(_) => assert_eq!(code, EXIT_SKIP),
        Outcome::Fail(r) => panic!("{name}: {r}"),
    }
}
