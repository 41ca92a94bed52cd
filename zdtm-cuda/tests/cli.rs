//! Command-line parsing.

use clap::Parser;
use zdtm_cuda::cli::{parse_device_map, Cli, Cmd, DeviceMapError};
use zdtm_cuda::runner::{Backend, CustomStorage, OptionStyle};

const A: &str = "GPU-0a1b2c3d-0000-1111-2222-333344445555";
const B: &str = "GPU-ffffffff-aaaa-bbbb-cccc-ddddeeeeffff";

fn run(args: &[&str]) -> Result<zdtm_cuda::cli::RunArgs, clap::Error> {
    let mut v = vec!["zdtm-cuda", "run"];
    v.extend_from_slice(args);
    match Cli::try_parse_from(v)?.command {
        Cmd::Run(r) => Ok(r),
        other => panic!("not run: {other:?}"),
    }
}

#[test]
fn run_defaults() {
    let r = run(&["--all"]).unwrap();
    assert!(r.all && r.tests.is_empty());
    assert_eq!(r.backend, [Backend::Auto]);
    assert_eq!(r.custom_storage, [CustomStorage::On, CustomStorage::Off]);
    assert_eq!(r.repeat, 1);
    assert_eq!(r.timeout, 300);
    assert_eq!(r.plugin_options, OptionStyle::Auto);
    assert_eq!(r.compile.arch.0, [80, 90]);
    assert!(!r.leave_running && !r.keep_images);
}

#[test]
fn run_everything() {
    let map = format!("{A}={B}, {B}={A}");
    let r = run(&[
        "cuda00",
        "cuda_graph00",
        "--backend",
        "driver-api,cuda-checkpoint",
        "--criu",
        "/c",
        "--libdir",
        "/l",
        "--leave-running",
        "--repeat",
        "3",
        "--device-map",
        &map,
        "--keep-images",
        "--junit",
        "j.xml",
        "--prebuilt",
        "/p",
        "--mib",
        "1024",
        "--arch",
        "sm_90,80,90",
        "-j",
        "2",
        "--plugin-options",
        "env",
    ])
    .unwrap();
    assert_eq!(r.tests, ["cuda00", "cuda_graph00"]);
    assert_eq!(r.backend, [Backend::DriverApi, Backend::CudaCheckpoint]);
    assert_eq!(r.repeat, 3);
    assert_eq!(
        r.device_map.as_deref(),
        Some(format!("{A}={B},{B}={A}").as_str())
    );
    assert_eq!(r.mib, Some(1024));
    assert_eq!(r.compile.arch.0, [80, 90]);
    assert_eq!(r.compile.jobs, Some(2));
    assert_eq!(r.plugin_options, OptionStyle::Env);
    assert!(r.leave_running && r.keep_images);
}

#[test]
fn custom_storage_flag() {
    let r = run(&["--all", "--custom-storage", "off"]).unwrap();
    assert_eq!(r.custom_storage, [CustomStorage::Off]);
    let r = run(&["--all", "--custom-storage", "on,off"]).unwrap();
    assert_eq!(r.custom_storage, [CustomStorage::On, CustomStorage::Off]);
    assert!(run(&["--all", "--custom-storage", "maybe"]).is_err());
}

#[test]
fn run_rejects() {
    for bad in [
        vec![],                             // neither --all nor tests
        vec!["--all", "cuda00"],            // both
        vec!["cuda99"],                     // unknown test
        vec!["--all", "--backend", "cuda"], // unknown backend
        vec!["--all", "--repeat", "0"],     // no cycle
        vec!["--all", "--device-map", "GPU-1=GPU-2"],
        vec!["--all", "--arch", "ampere"],
        vec!["--all", "--libdir", "/l", "--plugin", "/p.so"],
        vec!["--all", "--mib", "0"],
    ] {
        assert!(run(&bad).is_err(), "{bad:?} was accepted");
    }
    let e = run(&["cuda99"]).unwrap_err().to_string();
    assert!(
        e.contains("unknown test \"cuda99\" (known: cuda00, cuda_streams00"),
        "{e}"
    );
}

#[test]
fn other_subcommands() {
    let c = Cli::try_parse_from(["zdtm-cuda", "build", "--out", "/o", "cuda00"]).unwrap();
    let Cmd::Build(b) = c.command else { panic!() };
    assert_eq!(b.out.as_deref(), Some(std::path::Path::new("/o")));
    assert_eq!(b.tests, ["cuda00"]);
    let c = Cli::try_parse_from(["zdtm-cuda", "detect", "--criu", "/c"]).unwrap();
    assert!(matches!(c.command, Cmd::Detect(_)));
    assert!(Cli::try_parse_from(["zdtm-cuda", "list"]).is_ok());
}

#[test]
fn device_maps() {
    assert_eq!(
        parse_device_map(&format!(" {A} = {B} ,")),
        Ok(format!("{A}={B}"))
    );
    assert_eq!(parse_device_map(""), Err(DeviceMapError::Empty));
    assert_eq!(parse_device_map(A), Err(DeviceMapError::Entry(A.into())));
    assert_eq!(
        parse_device_map(&format!("{A}=GPU-xyz")),
        Err(DeviceMapError::Uuid("GPU-xyz".into()))
    );
    assert_eq!(
        parse_device_map(&format!("{A}={B},{A}={A}")),
        Err(DeviceMapError::Duplicate(A.into()))
    );
}
