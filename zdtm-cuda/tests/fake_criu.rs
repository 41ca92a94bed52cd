//! `run_one` with custom storage against a stand-in `criu` (a shell script) and a stand-in
//! workload (a shell script speaking the status protocol), with `--leave-running` so no task has
//! to be restored: no root, no CRIU, no GPU. The stand-in records its arguments and
//! `CRIU_PLUGIN_OPTIONS`, writes `cuda-cs-*.img` files when custom storage is on (except for
//! the workload named `nofiles00`), and logs the plugin's custom-storage line. One test, so no
//! other thread forks while the scripts are written (ETXTBSY).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use zdtm_cuda::report::{self, CsFiles, Outcome};
use zdtm_cuda::runner::{self, Backend, CustomStorage, RunConfig};
use zdtm_cuda::workloads::Workload;

const CRIU: &str = r#"#!/bin/sh
all="$*"
op=$1; shift
while [ $# -gt 0 ]; do
    case "$1" in
        -D) D=$2; shift ;;
        -W) W=$2; shift ;;
        -o) O=$2; shift ;;
        -t) T=$2; shift ;;
    esac
    shift
done
echo "$op $all" >>"$W/criu-args"
echo "$CRIU_PLUGIN_OPTIONS" >>"$W/criu-env"
case "$CRIU_PLUGIN_OPTIONS" in
    *custom-storage=on*)
        echo "(00.002) cuda_plugin: custom storage: on (dump 00ff): GPU memory goes straight to cuda-cs-*.img" >>"$W/$O"
        case "$W" in
            *nofiles00*) ;;
            *)
                head -c 8192 /dev/zero >"$D/cuda-cs-$T-0.img"
                head -c 4096 /dev/zero >"$D/cuda-cs-$T-1.img"
                ;;
        esac
        ;;
    *custom-storage=off*)
        echo "(00.002) cuda_plugin: custom storage: off (custom-storage=off); GPU memory is staged in host memory" >>"$W/$O"
        ;;
esac
echo "(00.003) cuda_plugin: CHECKPOINT_DEVICES pid $T: done in 4.0 ms" >>"$W/$O"
exit 0
"#;

const WORKLOAD: &str = r#"#!/bin/sh
st="$2"
trap 'echo PASS >>"$st"; exit 0' USR1
echo "READY bytes=1048576" >>"$st"
i=0
while [ $i -lt 600 ]; do
    sleep 0.1 &
    wait $!
    i=$((i + 1))
done
echo "FAIL: no SIGUSR1" >>"$st"
exit 1
"#;

fn script(p: &Path, text: &str) {
    std::fs::write(p, text).unwrap();
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
}

const fn workload(name: &'static str) -> Workload {
    Workload {
        name,
        summary: "shell stand-in",
        source: "",
        min_gpus: 0,
        needs_cublas: false,
    }
}

#[test]
fn custom_storage_cases_through_a_stand_in_criu() {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    script(&dir.path().join("criu"), CRIU);
    script(&bin.join("fake00"), WORKLOAD);
    script(&bin.join("nofiles00"), WORKLOAD);
    let cfg = RunConfig {
        criu: dir.path().join("criu"),
        libdir: dir.path().join("plugins"),
        backend: Backend::DriverApi,
        bin_dir: bin,
        work_dir: dir.path().join("work"),
        leave_running: true,
        repeat: 1,
        device_map: None,
        keep_images: false,
        cli_options: true,
        mib: None,
        timeout: Duration::from_secs(30),
        env: Vec::new(),
        custom_storage: None,
    };
    let fake = workload("fake00");
    let mut results = Vec::new();
    for cs in [CustomStorage::On, CustomStorage::Off] {
        let r = runner::run_one(
            &RunConfig {
                custom_storage: Some(cs),
                ..cfg.clone()
            },
            &fake,
        );
        assert_eq!(r.outcome, Outcome::Pass, "{r:#?}");
        assert_eq!(
            r.case_name(),
            format!("fake00[custom-storage={}]", cs.as_str())
        );
        let logs = dir.path().join(format!(
            "work/driver-api/custom-storage-{}/fake00",
            cs.as_str()
        ));
        assert_eq!(r.log_dir.as_deref(), Some(logs.to_str().unwrap()));
        let opt = format!("cuda_plugin.custom-storage={}", cs.as_str());
        // The option reaches the CRIU invocation: on the command line and in the environment.
        let args = std::fs::read_to_string(logs.join("criu-args")).unwrap();
        assert!(args.starts_with("dump "), "{args}");
        assert!(args.contains(&format!("--plugin-option {opt}")), "{args}");
        let env = std::fs::read_to_string(logs.join("criu-env")).unwrap();
        assert_eq!(env.trim(), format!("cuda_plugin.backend=driver-api {opt}"));
        let want = match cs {
            CustomStorage::On => CsFiles {
                files: 2,
                bytes: 12288,
            },
            CustomStorage::Off => CsFiles::default(),
        };
        assert_eq!(r.cycles[0].cs_files, Some(want));
        assert!(
            r.notes
                .iter()
                .any(|n| n.starts_with(&format!("plugin (dump): custom storage: {}", cs.as_str()))),
            "{:?}",
            r.notes
        );
        assert!(r.summary().criu_dump_gbps.is_some());
        results.push(r);
    }

    // Custom storage asked for, no file written: the runner says so.
    let r = runner::run_one(
        &RunConfig {
            custom_storage: Some(CustomStorage::On),
            ..cfg.clone()
        },
        &workload("nofiles00"),
    );
    assert_eq!(
        r.outcome,
        Outcome::Fail(
            "cycle 1: custom-storage=on, but the dump wrote no cuda-cs-*.img file".into()
        )
    );

    // Without the setting, no option and no count.
    let r = runner::run_one(&cfg, &fake);
    assert_eq!(r.outcome, Outcome::Pass, "{r:#?}");
    assert_eq!(
        (r.case_name(), r.cycles[0].cs_files),
        ("fake00".to_owned(), None)
    );
    let env = std::fs::read_to_string(dir.path().join("work/driver-api/fake00/criu-env")).unwrap();
    assert_eq!(env.trim(), "cuda_plugin.backend=driver-api");

    let x = report::junit(&results);
    assert!(x.contains("name=\"fake00[custom-storage=on]\""), "{x}");
    assert!(x.contains("name=\"fake00[custom-storage=off]\""), "{x}");
    assert!(
        x.contains("<property name=\"cs_files\" value=\"2\"/>"),
        "{x}"
    );
    let t = report::table(&results);
    assert!(t.contains("Custom storage on vs off"), "{t}");
}
