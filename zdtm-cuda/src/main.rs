//! The `zdtm-cuda` command: see `zdtm-cuda --help` and the crate documentation.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Parser;

use zdtm_cuda::cli::{BuildArgs, Cli, Cmd, CompileArgs, RunArgs};
use zdtm_cuda::detect::{self, Detection, Probe};
use zdtm_cuda::report;
use zdtm_cuda::runner::{self, OptionStyle, RunConfig};
use zdtm_cuda::toolchain::{self, NvccLookup};
use zdtm_cuda::workloads::{self, Workload};

fn main() -> ExitCode {
    match real_main() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("zdtm-cuda: error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn real_main() -> Result<ExitCode> {
    let cli = Cli::parse();
    match cli.command {
        Cmd::Detect(a) => {
            let d = detect::detect(&Probe::system(a.criu, a.prebuilt));
            print!("{}", d.render());
            for w in workloads::ALL {
                match d.skip_reason(w) {
                    None => println!("{:<16} runnable", w.name),
                    Some(r) => println!("{:<16} SKIP: {r}", w.name),
                }
            }
            match d.custom_storage_skip(runner::Backend::DriverApi) {
                None => println!("custom-storage=on cases runnable (driver-api backend)"),
                Some(r) => println!("custom-storage=on cases SKIP: {r}"),
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::CudaDriver => match detect::probe_libcuda() {
            Ok((version, complete)) => {
                println!("cuda_driver_version={version}");
                println!(
                    "checkpoint_operation_complete={}",
                    if complete { "yes" } else { "no" }
                );
                Ok(ExitCode::SUCCESS)
            }
            Err(e) => {
                eprintln!("zdtm-cuda: {e}");
                Ok(ExitCode::FAILURE)
            }
        },
        Cmd::List => {
            for w in workloads::ALL {
                println!("{:<16} {}", w.name, w.summary);
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Build(a) => build_cmd(&a),
        Cmd::Run(a) => run_cmd(&a),
    }
}

fn selected(names: &[String]) -> Vec<Workload> {
    if names.is_empty() {
        workloads::ALL.to_vec()
    } else {
        workloads::ALL
            .iter()
            .filter(|w| names.iter().any(|n| n == w.name))
            .copied()
            .collect()
    }
}

fn compile(c: &CompileArgs, out: &Path, ws: &[Workload]) -> Result<()> {
    let mut lookup = NvccLookup::from_env();
    if let Some(n) = &c.nvcc {
        lookup.explicit = Some(n.clone());
    }
    let nvcc = toolchain::find_nvcc(&lookup)?;
    let version = toolchain::nvcc_version(&nvcc.path).unwrap_or_else(|| "version unknown".into());
    let jobs = c.jobs.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map_or(1, usize::from)
            .min(4)
    });
    let archs: Vec<u32> = c.arch.0.clone();
    println!(
        "building {} workload(s) with {} ({}; {version}) for sm_{} into {} ({jobs} job(s))",
        ws.len(),
        nvcc.path.display(),
        nvcc.source.label(),
        archs
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(",sm_"),
        out.display()
    );
    match toolchain::build(&nvcc.path, out, &archs, jobs, ws) {
        Ok(r) => {
            for b in &r.built {
                println!("  {:<16} {:>6.1} s", b.name, b.elapsed.as_secs_f64());
                for l in b.output.lines() {
                    println!("    {l}");
                }
            }
            println!("built in {:.1} s", r.elapsed.as_secs_f64());
            Ok(())
        }
        Err(toolchain::ToolchainError::Compile { logs, names, .. }) => {
            for (n, l) in logs {
                eprintln!("--- {n}:\n{l}");
            }
            bail!("compilation failed: {names}")
        }
        Err(e) => Err(e.into()),
    }
}

fn build_cmd(a: &BuildArgs) -> Result<ExitCode> {
    let out = a
        .out
        .clone()
        .unwrap_or_else(|| toolchain::workspace_root().join("target/zdtm-cuda/bin"));
    compile(&a.compile, &out, &selected(&a.tests))?;
    Ok(ExitCode::SUCCESS)
}

/// A plugin directory: `--libdir`, or a fresh one holding a copy of `--plugin` (or of the
/// workspace's built plugin) as cuda_plugin.so.
fn plugin_dir(a: &RunArgs, work: &Path) -> Result<PathBuf> {
    if let Some(d) = &a.libdir {
        let so = d.join("cuda_plugin.so");
        if !so.is_file() {
            bail!("--libdir {}: no cuda_plugin.so in it", d.display());
        }
        return Ok(d.clone());
    }
    let so = match &a.plugin {
        Some(p) => p.clone(),
        None => {
            let target = std::env::var_os("CARGO_TARGET_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| toolchain::workspace_root().join("target"));
            ["release", "debug"]
                .iter()
                .map(|p| target.join(p).join("libcuda_plugin.so"))
                .find(|p| p.is_file())
                .with_context(|| {
                    format!(
                        "no plugin: pass --libdir DIR (holding cuda_plugin.so) or --plugin SO, or build it (cargo build --release -p cuda-plugin; looked in {})",
                        target.display()
                    )
                })?
        }
    };
    let dir = work.join("plugins");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::copy(&so, dir.join("cuda_plugin.so"))
        .with_context(|| format!("copying {} into {}", so.display(), dir.display()))?;
    Ok(dir)
}

fn criu_has_plugin_option(criu: &Path) -> bool {
    std::process::Command::new(criu)
        .arg("--help")
        .output()
        .map(|o| {
            let mut s = String::from_utf8_lossy(&o.stdout).into_owned();
            s.push_str(&String::from_utf8_lossy(&o.stderr));
            s.contains("plugin-option")
        })
        .unwrap_or(false)
}

fn run_cmd(a: &RunArgs) -> Result<ExitCode> {
    let work = a
        .work_dir
        .clone()
        .unwrap_or_else(|| toolchain::workspace_root().join("target/zdtm-cuda/run"));
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    let tests = selected(if a.all { &[] } else { &a.tests });
    let mut probe = Probe::system(a.criu.clone(), a.prebuilt.clone());
    if let Some(n) = &a.compile.nvcc {
        probe.nvcc.explicit = Some(n.clone());
    }
    let d: Detection = detect::detect(&probe);
    print!("{}", d.render());
    println!();

    let runnable: Vec<&Workload> = tests
        .iter()
        .filter(|w| d.skip_reason(w).is_none())
        .collect();
    let mut config = None;
    if !runnable.is_empty() {
        let bin_dir = match &a.prebuilt {
            Some(p) => p.clone(),
            None => {
                let out = work.join("bin");
                let ws: Vec<Workload> = runnable.iter().map(|w| **w).collect();
                compile(&a.compile, &out, &ws)?;
                out
            }
        };
        let libdir = plugin_dir(a, &work)?;
        let criu = d.criu.as_ref().map_err(|e| anyhow::anyhow!("{e}"))?;
        let cli_options = match a.plugin_options {
            OptionStyle::Env => false,
            OptionStyle::Cli => true,
            OptionStyle::Auto => criu_has_plugin_option(&criu.path),
        };
        if let Err(e) = runner::become_subreaper() {
            eprintln!("zdtm-cuda: warning: cannot become a child subreaper ({e}); restored tasks' exit codes will be unknown");
        }
        let mut env: Vec<(OsString, OsString)> = Vec::new();
        let tc_libs = toolchain::wheel_paths(&toolchain::default_toolchain_dir(), "lib");
        if !tc_libs.is_empty() {
            let mut dirs: Vec<PathBuf> = tc_libs.into_iter().filter(|p| p.is_dir()).collect();
            if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
                dirs.extend(std::env::split_paths(&old));
            }
            env.push(("LD_LIBRARY_PATH".into(), std::env::join_paths(dirs)?));
        }
        println!(
            "CRIU {} ({}), plugin dir {}, options via {}",
            criu.version,
            criu.path.display(),
            libdir.display(),
            if cli_options {
                "--plugin-option and CRIU_PLUGIN_OPTIONS"
            } else {
                "CRIU_PLUGIN_OPTIONS"
            }
        );
        config = Some(RunConfig {
            criu: criu.path.clone(),
            libdir,
            backend: runner::Backend::Auto,
            bin_dir,
            work_dir: work.clone(),
            leave_running: a.leave_running,
            repeat: a.repeat,
            device_map: a.device_map.clone(),
            keep_images: a.keep_images,
            cli_options,
            mib: a.mib,
            timeout: Duration::from_secs(a.timeout),
            env,
            custom_storage: None,
        });
    }

    let mut results = Vec::new();
    for &backend in &a.backend {
        for case in runner::cases(&d, &tests, backend, &a.custom_storage) {
            let name = case.name();
            let r = match (&case.skip, &config) {
                (Some(reason), _) => {
                    println!("{name} ({}): SKIP: {reason}", backend.as_str());
                    runner::skipped_case(&case, backend, reason.clone())
                }
                (None, Some(cfg)) => {
                    let cfg = RunConfig {
                        backend,
                        custom_storage: case.custom_storage,
                        ..cfg.clone()
                    };
                    println!("{name} ({}) ...", backend.as_str());
                    let r = runner::run_one(&cfg, &case.workload);
                    println!("{name} ({}): {}", backend.as_str(), r.outcome.label());
                    r
                }
                (None, None) => unreachable!("a runnable test implies a configuration"),
            };
            results.push(r);
        }
    }
    println!();
    print!("{}", report::table(&results));
    if let Some(j) = &a.junit {
        std::fs::write(j, report::junit(&results))
            .with_context(|| format!("writing {}", j.display()))?;
        println!("JUnit: {}", j.display());
    }
    let (_, failed, _) = report::counts(&results);
    Ok(if failed > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}
