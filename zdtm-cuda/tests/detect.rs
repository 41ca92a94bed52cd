//! Detection and skip logic against fake `/proc/driver/nvidia` trees and a scripted command
//! runner: no GPU needed.

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use zdtm_cuda::detect::{
    self, criu_version_ok, parse_criu_version, parse_cuda_driver_probe, parse_proc_driver_version,
    parse_smi_cuda_version, CommandRunner, Probe,
};
use zdtm_cuda::runner::{self, Backend, CustomStorage};
use zdtm_cuda::toolchain::NvccLookup;
use zdtm_cuda::workloads;

/// Answers `<file name of prog> <args...>` from a table.
#[derive(Debug, Default)]
struct Fake(HashMap<String, String>);

impl CommandRunner for Fake {
    fn stdout(&self, prog: &Path, args: &[&str]) -> Option<String> {
        let name = prog.file_name()?.to_string_lossy().into_owned();
        let key = std::iter::once(name.as_str())
            .chain(args.iter().copied())
            .collect::<Vec<_>>()
            .join(" ");
        self.0.get(&key).cloned()
    }
}

const PROC_VERSION: &str = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build  (dvs-builder@U16-I3-B03-4-3)  Tue Jul 22 20:23:13 UTC 2025\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n";

fn executable(p: &Path) {
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// A machine: `gpus` GPUs (None: no driver at all), a criu 4.1.1 in bin/, nvcc, cuBLAS, root.
struct Machine {
    dir: tempfile::TempDir,
}

impl Machine {
    fn new(gpus: Option<usize>) -> Self {
        let dir = tempfile::tempdir().unwrap();
        if let Some(n) = gpus {
            let nv = dir.path().join("root/proc/driver/nvidia");
            std::fs::create_dir_all(nv.join("gpus")).unwrap();
            std::fs::write(nv.join("version"), PROC_VERSION).unwrap();
            for i in 0..n {
                std::fs::create_dir_all(nv.join(format!("gpus/0000:{:02x}:00.0", i + 1))).unwrap();
            }
        } else {
            std::fs::create_dir_all(dir.path().join("root")).unwrap();
        }
        executable(&dir.path().join("bin/criu"));
        executable(&dir.path().join("cuda/bin/nvcc"));
        std::fs::create_dir_all(dir.path().join("lib")).unwrap();
        std::fs::write(dir.path().join("lib/libcublas.so.13"), "").unwrap();
        Machine { dir }
    }

    fn p(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    fn probe(&self, answers: &[(&str, &str)]) -> Probe {
        Probe {
            root: self.p("root"),
            path_var: Some(self.p("bin").into_os_string()),
            euid: 0,
            nvcc: NvccLookup {
                explicit: None,
                path_var: Some(self.p("bin").into_os_string()),
                cuda_home: Some(self.p("cuda")),
                toolchain_dir: None,
            },
            prebuilt: None,
            criu: None,
            criu_versions: None,
            lib_dirs: vec![self.p("lib")],
            self_exe: Some(self.p("bin/zdtm-cuda")),
            runner: Box::new(Fake(
                answers
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            )),
        }
    }
}

const CRIU_OK: (&str, &str) = ("criu --version", "Version: 4.1.1\n");

#[test]
fn parses_driver_versions() {
    assert_eq!(
        parse_proc_driver_version(PROC_VERSION).as_deref(),
        Some("580.65.06")
    );
    let proprietary =
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n";
    assert_eq!(
        parse_proc_driver_version(proprietary).as_deref(),
        Some("550.54.15")
    );
    assert_eq!(parse_proc_driver_version("GCC version: 12\n"), None);
}

#[test]
fn parses_criu_versions() {
    assert_eq!(
        parse_criu_version("Version: 4.1.1\nGitID: v4.1.1\n").as_deref(),
        Some("4.1.1")
    );
    assert_eq!(parse_criu_version("criu: unknown\n"), None);
    assert!(criu_version_ok("4.0"));
    assert!(criu_version_ok("4.2.1"));
    assert!(criu_version_ok("5.0-rc1"));
    assert!(!criu_version_ok("3.17"));
    assert!(!criu_version_ok("x"));
}

#[test]
fn everything_present_runs_everything_but_multigpu_on_one_gpu() {
    let m = Machine::new(Some(1));
    let d = detect::detect(&m.probe(&[CRIU_OK]));
    assert_eq!(d.driver.as_ref().unwrap().version, "580.65.06");
    assert_eq!(d.gpus, Ok(1));
    assert_eq!(d.criu.as_ref().unwrap().version, "4.1.1");
    assert!(d.cublas.as_ref().unwrap().ends_with("libcublas.so.13"));
    for w in workloads::ALL {
        let r = d.skip_reason(w);
        if w.name == "cuda_multigpu00" {
            assert_eq!(r.as_deref(), Some("needs 2 GPUs, this machine has 1"));
        } else {
            assert_eq!(r, None, "{}", w.name);
        }
    }
    let m2 = Machine::new(Some(2));
    let d2 = detect::detect(&m2.probe(&[CRIU_OK]));
    assert_eq!(
        d2.skip_reason(workloads::find("cuda_multigpu00").unwrap()),
        None
    );
}

#[test]
fn no_driver_is_the_reason_for_every_test() {
    let m = Machine::new(None);
    let d = detect::detect(&m.probe(&[CRIU_OK]));
    let want = format!(
        "no NVIDIA driver: {} is missing and nvidia-smi is not in PATH",
        m.p("root/proc/driver/nvidia/version").display()
    );
    assert_eq!(d.driver, Err(want.clone()));
    for w in workloads::ALL {
        assert_eq!(d.skip_reason(w), Some(want.clone()));
    }
}

#[test]
fn nvidia_smi_is_the_fallback_without_proc() {
    let m = Machine::new(None);
    executable(&m.p("bin/nvidia-smi"));
    let d = detect::detect(&m.probe(&[
        CRIU_OK,
        (
            "nvidia-smi --query-gpu=driver_version --format=csv,noheader",
            "575.51.03\n575.51.03\n",
        ),
        (
            "nvidia-smi -L",
            "GPU 0: NVIDIA H200 (UUID: GPU-1)\nGPU 1: NVIDIA H200 (UUID: GPU-2)\n",
        ),
    ]));
    assert_eq!(d.driver.as_ref().unwrap().version, "575.51.03");
    assert_eq!(d.gpus, Ok(2));
}

#[test]
fn empty_gpu_directory_means_no_gpu() {
    let m = Machine::new(Some(0));
    let d = detect::detect(&m.probe(&[CRIU_OK]));
    assert!(d.driver.is_ok());
    let reason = d.skip_reason(&workloads::ALL[0]).unwrap();
    assert!(
        reason.starts_with("no GPU: ") && reason.ends_with("is empty"),
        "{reason}"
    );
}

#[test]
fn old_or_broken_criu_is_a_skip() {
    let m = Machine::new(Some(1));
    let d = detect::detect(&m.probe(&[("criu --version", "Version: 3.17.1\n")]));
    let r = d.skip_reason(&workloads::ALL[0]).unwrap();
    assert!(r.ends_with("is CRIU 3.17.1, need 4.0 or newer"), "{r}");
    let d = detect::detect(&m.probe(&[]));
    assert!(d
        .skip_reason(&workloads::ALL[0])
        .unwrap()
        .ends_with("'--version' failed"));
    // Nothing at all.
    let mut p = m.probe(&[CRIU_OK]);
    p.path_var = None;
    let r = detect::detect(&p).skip_reason(&workloads::ALL[0]).unwrap();
    assert!(r.starts_with("CRIU not found"), "{r}");
}

#[test]
fn criu_from_the_versions_file_prefers_the_newest() {
    let m = Machine::new(Some(1));
    executable(&m.p("c41/criu"));
    executable(&m.p("c42/criu"));
    let versions = m.p("versions");
    std::fs::write(
        &versions,
        format!(
            "4.1.1 {}\n4.2.1 {}\n",
            m.p("c41/criu").display(),
            m.p("c42/criu").display()
        ),
    )
    .unwrap();
    let mut p = m.probe(&[("criu --version", "Version: 4.2.1\n")]);
    p.path_var = None;
    p.criu_versions = Some(versions);
    let d = detect::detect(&p);
    assert_eq!(d.criu.as_ref().unwrap().path, m.p("c42/criu"));
}

#[test]
fn not_root_comes_first() {
    let m = Machine::new(None);
    let mut p = m.probe(&[]);
    p.euid = 1000;
    let d = detect::detect(&p);
    assert_eq!(
        d.skip_reason(&workloads::ALL[0]).as_deref(),
        Some("not root (euid 1000): CRIU needs root to dump and restore")
    );
}

#[test]
fn missing_cublas_skips_only_the_cublas_test() {
    let m = Machine::new(Some(1));
    std::fs::remove_file(m.p("lib/libcublas.so.13")).unwrap();
    let mut p = m.probe(&[CRIU_OK]);
    p.runner = Box::new(Fake(
        [
            (
                "ldconfig -p".to_owned(),
                "1 libs found\n\tlibc.so.6 (libc6,x86-64) => /lib/libc.so.6\n".to_owned(),
            ),
            ("criu --version".to_owned(), "Version: 4.1.1\n".to_owned()),
        ]
        .into_iter()
        .collect(),
    ));
    let d = detect::detect(&p);
    for w in workloads::ALL.iter().filter(|w| w.min_gpus == 1) {
        let r = d.skip_reason(w);
        if w.needs_cublas {
            assert!(r
                .unwrap()
                .starts_with("cuBLAS not found: none of libcublas.so.13"));
        } else {
            assert_eq!(r, None, "{}", w.name);
        }
    }
}

#[test]
fn cublas_from_ldconfig_cache() {
    let m = Machine::new(Some(1));
    std::fs::remove_file(m.p("lib/libcublas.so.13")).unwrap();
    executable(&m.p("bin/ldconfig"));
    let d = detect::detect(&m.probe(&[
        CRIU_OK,
        (
            "ldconfig -p",
            "\tlibcublas.so.12 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcublas.so.12\n",
        ),
    ]));
    // /sbin/ldconfig of the host may answer first; only the fake table knows "ldconfig -p".
    assert_eq!(
        d.cublas,
        Ok(PathBuf::from("/usr/lib/x86_64-linux-gnu/libcublas.so.12"))
    );
}

#[test]
fn without_nvcc_a_prebuilt_directory_is_enough() {
    let m = Machine::new(Some(1));
    std::fs::remove_file(m.p("cuda/bin/nvcc")).unwrap();
    let d = detect::detect(&m.probe(&[CRIU_OK]));
    let r = d.skip_reason(&workloads::ALL[0]).unwrap();
    assert!(r.starts_with("nvcc not found"), "{r}");

    let pre = m.p("pre");
    let mut p = m.probe(&[CRIU_OK]);
    p.prebuilt = Some(pre.clone());
    std::fs::create_dir_all(&pre).unwrap();
    let r = detect::detect(&p).skip_reason(&workloads::ALL[0]).unwrap();
    assert!(r.contains("lacks cuda00, cuda_streams00"), "{r}");
    for w in workloads::ALL {
        executable(&pre.join(w.name));
    }
    let mut p = m.probe(&[CRIU_OK]);
    p.prebuilt = Some(pre);
    assert_eq!(detect::detect(&p).skip_reason(&workloads::ALL[0]), None);
}

#[test]
fn render_lists_every_probe() {
    let m = Machine::new(None);
    let out = detect::detect(&m.probe(&[CRIU_OK])).render();
    let names: Vec<&str> = out
        .lines()
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "driver",
            "gpus",
            "cuda",
            "workloads",
            "cublas",
            "criu",
            "root"
        ]
    );
    assert!(out.contains("criu       ok    4.1.1"), "{out}");
    assert!(out.contains("driver     SKIP  no NVIDIA driver"), "{out}");
}

const CUDA_13_4: (&str, &str) = (
    "zdtm-cuda cuda-driver",
    "cuda_driver_version=13040\ncheckpoint_operation_complete=yes\n",
);
const CUDA_13_0: (&str, &str) = (
    "zdtm-cuda cuda-driver",
    "cuda_driver_version=13000\ncheckpoint_operation_complete=no\n",
);
const BOTH: &[CustomStorage] = &[CustomStorage::On, CustomStorage::Off];

#[test]
fn parses_cuda_versions() {
    let d = parse_cuda_driver_probe(CUDA_13_4.1, "libcuda.so.1").unwrap();
    assert_eq!((d.version, d.operation_complete), (13040, Some(true)));
    assert_eq!(d.custom_storage_blocker(), None);
    assert_eq!(
        parse_cuda_driver_probe("cuda_driver_version=0\n", "x"),
        None
    );
    assert_eq!(parse_cuda_driver_probe("garbage\n", "x"), None);
    let smi = "+---------------------------------------------------------------------------------------+\n| NVIDIA-SMI 580.65.06              Driver Version: 580.65.06      CUDA Version: 13.0     |\n";
    assert_eq!(parse_smi_cuda_version(smi), Some(13000));
    assert_eq!(
        parse_smi_cuda_version("CUDA Version                              : 13.4\n"),
        Some(13040)
    );
    assert_eq!(parse_smi_cuda_version("Driver Version: 1\n"), None);
    assert_eq!(detect::cuda_version_str(12080), "12.8");
}

#[test]
fn cases_on_a_cuda_13_4_driver_run_custom_storage_on_and_off() {
    let m = Machine::new(Some(1));
    let d = detect::detect(&m.probe(&[CRIU_OK, CUDA_13_4]));
    let c = d.cuda.as_ref().unwrap();
    assert_eq!((c.version, c.operation_complete), (13040, Some(true)));
    assert!(d.render().contains("cuda       ok    13.4 (13040; custom storage, cuCheckpointOperationComplete resolves; libcuda.so.1)"), "{}", d.render());
    let cases = runner::cases(&d, workloads::ALL, Backend::DriverApi, BOTH);
    assert_eq!(cases.len(), 2 * workloads::ALL.len());
    let names: Vec<String> = cases.iter().take(2).map(runner::Case::name).collect();
    assert_eq!(
        names,
        ["cuda00[custom-storage=on]", "cuda00[custom-storage=off]"]
    );
    for c in &cases {
        if c.workload.name == "cuda_multigpu00" {
            assert_eq!(c.skip.as_deref(), Some("needs 2 GPUs, this machine has 1"));
        } else {
            assert_eq!(c.skip, None, "{}", c.name());
        }
    }
    // Only the flag's settings; none: the option is not passed at all.
    let on = runner::cases(
        &d,
        &workloads::ALL[..1],
        Backend::Auto,
        &[CustomStorage::On],
    );
    assert_eq!((on.len(), on[0].skip.clone()), (1, None));
    let plain = runner::cases(&d, &workloads::ALL[..1], Backend::DriverApi, &[]);
    assert_eq!(
        (plain[0].name(), plain[0].custom_storage),
        ("cuda00".to_owned(), None)
    );
    // cuda-checkpoint has no custom storage: the on case is skipped with why.
    let cc = runner::cases(&d, &workloads::ALL[..1], Backend::CudaCheckpoint, BOTH);
    assert_eq!(
        cc[0].skip.as_deref(),
        Some("custom storage needs the driver-api backend; cuda-checkpoint has none")
    );
    assert_eq!(cc[1].skip, None);
}

#[test]
fn cases_on_a_cuda_13_0_driver_skip_custom_storage_on_with_the_reason() {
    let m = Machine::new(Some(1));
    let d = detect::detect(&m.probe(&[CRIU_OK, CUDA_13_0]));
    assert!(
        d.render()
            .contains("cuda       ok    13.0 (13000; no custom storage; libcuda.so.1)"),
        "{}",
        d.render()
    );
    let cases = runner::cases(&d, &workloads::ALL[..2], Backend::DriverApi, BOTH);
    let got: Vec<(String, Option<String>)> =
        cases.iter().map(|c| (c.name(), c.skip.clone())).collect();
    let reason = Some("custom storage needs a CUDA 13.4 driver; this one reports 13.0".to_owned());
    assert_eq!(
        got,
        [
            ("cuda00[custom-storage=on]".to_owned(), reason.clone()),
            ("cuda00[custom-storage=off]".to_owned(), None),
            ("cuda_streams00[custom-storage=on]".to_owned(), reason),
            ("cuda_streams00[custom-storage=off]".to_owned(), None),
        ]
    );
    // A 13.4 driver whose cuGetProcAddress does not find cuCheckpointOperationComplete.
    let odd = detect::detect(&m.probe(&[
        CRIU_OK,
        (
            "zdtm-cuda cuda-driver",
            "cuda_driver_version=13040\ncheckpoint_operation_complete=no\n",
        ),
    ]));
    let r = odd.custom_storage_skip(Backend::DriverApi).unwrap();
    assert!(r.contains("does not resolve"), "{r}");
    // A workload that cannot run at all keeps its own reason in both cases.
    let cases = runner::cases(
        &d,
        &[*workloads::find("cuda_multigpu00").unwrap()],
        Backend::DriverApi,
        BOTH,
    );
    assert!(cases
        .iter()
        .all(|c| c.skip.as_deref() == Some("needs 2 GPUs, this machine has 1")));
}

#[test]
fn an_unknown_cuda_version_skips_custom_storage_on_and_nvidia_smi_is_asked_next() {
    let m = Machine::new(Some(1));
    let d = detect::detect(&m.probe(&[CRIU_OK]));
    let why = d.custom_storage_skip(Backend::DriverApi).unwrap();
    assert!(why.starts_with("custom storage needs a CUDA 13.4 driver; CUDA version unknown: libcuda.so.1 could not be asked"), "{why}");
    let cases = runner::cases(&d, &workloads::ALL[..1], Backend::DriverApi, BOTH);
    assert_eq!(cases[0].skip.as_deref(), Some(why.as_str()));
    assert_eq!(cases[1].skip, None);
    // The workloads themselves still run.
    assert_eq!(d.skip_reason(&workloads::ALL[0]), None);

    executable(&m.p("bin/nvidia-smi"));
    let d = detect::detect(&m.probe(&[
        CRIU_OK,
        (
            "nvidia-smi",
            "| NVIDIA-SMI 590.10   Driver Version: 590.10   CUDA Version: 13.4 |\n",
        ),
    ]));
    let c = d.cuda.as_ref().unwrap();
    assert_eq!((c.version, c.operation_complete), (13040, None));
    assert!(c.source.ends_with("nvidia-smi"));
    assert_eq!(d.custom_storage_skip(Backend::DriverApi), None);
}
