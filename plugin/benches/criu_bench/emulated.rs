//! The emulated engine: `harness --host pr3076 dump` / `restore` of an 8-task CUDA tree per
//! backend, and the plugin's per-call hook latency from its log.

use crate::ensure;
use crate::run::{keep_all, tail, Bench, Run};
use crate::sample::collect_hooks;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use testkit::criu::*;

#[derive(Debug, Clone, Default)]
pub(crate) struct Emulated {
    /// backend → hook → per-call ms.
    pub(crate) hooks: BTreeMap<String, BTreeMap<String, Vec<f64>>>,
    /// backend → (dump ms, restore ms) per round.
    pub(crate) walls: BTreeMap<String, Vec<(f64, f64)>>,
    pub(crate) note: Option<String>,
}

pub(crate) const EMULATED_TASKS: usize = 8;

pub(crate) fn harness_exe() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let h = exe.parent()?.parent()?.join("harness");
    h.is_file().then_some(h)
}

pub(crate) fn emulated(b: &Bench, rounds: usize) -> Emulated {
    let mut e = Emulated::default();
    let Some(harness) = harness_exe() else {
        e.note = Some(
            "skipped: no `harness` next to this bench's profile directory (scripts/bench.sh \
             builds it)"
                .into(),
        );
        return e;
    };
    let backends = ["driver-api", "cuda-checkpoint"];
    for round in 0..rounds {
        for k in 0..backends.len() {
            let be = backends[(k + round) % backends.len()];
            match emulated_once(b, &harness, be) {
                Ok((hooks, d, r)) => {
                    let per = e.hooks.entry(be.to_owned()).or_default();
                    for (h, v) in hooks {
                        per.entry(h).or_default().extend(v);
                    }
                    e.walls.entry(be.to_owned()).or_default().push((d, r));
                }
                Err(err) => {
                    e.note = Some(format!("{be}: {err}"));
                    eprintln!("criu_bench: emulated {be}: {err}");
                }
            }
        }
    }
    e
}

fn emulated_once(
    b: &Bench,
    harness: &Path,
    backend: &str,
) -> R<(BTreeMap<String, Vec<f64>>, f64, f64)> {
    let mut run = Run::new(b, Some(backend), None, "criu-bench-emu-")?;
    let r = (|| {
        run.spawn_tree(EMULATED_TASKS, false)?;
        let img = run.path.join("img");
        let imgs = img.display().to_string();
        let lib = run.libdir.display().to_string();
        let root = run.pids[0].to_string();
        let opt = format!("cuda_plugin.backend={backend}");
        let dlog = run.path.join("emu-dump.log");
        let rlog = run.path.join("emu-restore.log");
        let (dl, rl) = (dlog.display().to_string(), rlog.display().to_string());
        let (ok, d_ms, d_text) = run.timed(
            harness,
            &[
                "--host",
                "pr3076",
                "dump",
                "-t",
                &root,
                "-D",
                &imgs,
                "-L",
                &lib,
                "-v4",
                "-o",
                &dl,
                "--plugin-option",
                &opt,
            ],
            &dlog,
        )?;
        ensure!(ok, "harness dump failed:\n{}", tail(&d_text, 20));
        let (ok, r_ms, r_text) = run.timed(
            harness,
            &[
                "--host", "pr3076", "restore", "-D", &imgs, "-L", &lib, "-v4", "-o", &rl,
            ],
            &rlog,
        )?;
        ensure!(ok, "harness restore failed:\n{}", tail(&r_text, 20));
        run.check_restored()?;
        let mut hooks = BTreeMap::new();
        collect_hooks(&mut hooks, &d_text);
        collect_hooks(&mut hooks, &r_text);
        ensure!(
            !hooks.is_empty(),
            "no \"done in\" lines in the harness logs:\n{}",
            tail(&d_text, 20)
        );
        Ok((hooks, d_ms, r_ms))
    })();
    run.keep = r.is_err() || keep_all();
    r
}
