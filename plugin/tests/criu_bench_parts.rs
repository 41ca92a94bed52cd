//! The unit tests of the CRIU benchmark's self-contained modules (`benches/criu_bench/`): the
//! command line, the configurations and the decoder of CRIU's stats images. The bench is a
//! `harness = false` target, which runs no `#[test]` functions: its tests live here.

#![expect(
    dead_code,
    reason = "the bench uses more of these modules than the tests do"
)]

#[path = "../benches/criu_bench/args.rs"]
mod args;
#[path = "../benches/criu_bench/config.rs"]
mod config;
#[path = "../benches/criu_bench/stats.rs"]
mod stats;

use args::{Args, Opts};
use clap::Parser;
use config::Config;
use stats::{decode_stats, read_stats, CriuStats, RestoreStatsEntry, StatsEntry, STATS_MAGIC};
use std::path::Path;

fn opts(args: &[&str]) -> Result<Opts, String> {
    let a = Args::try_parse_from(std::iter::once("criu_bench").chain(args.iter().copied()))
        .map_err(|e| e.to_string())?;
    Opts::resolve(a)
}

#[test]
fn the_smoke_test_is_one_round_of_n_1_with_nothing_written() {
    let o = opts(&[]).unwrap();
    assert!(!o.bench);
    assert_eq!((o.rounds, o.sizes.clone()), (1, vec![1]));
    assert!(!o.emulated && !o.scenarios && o.no_svg);
    let o = opts(&["--rounds", "2", "--sizes", "1, 8"]).unwrap();
    assert_eq!((o.rounds, o.sizes), (2, vec![1, 8]));
}

#[test]
fn a_benchmark_run_takes_every_option() {
    let o = opts(&[
        "--bench",
        "--rounds",
        "3",
        "--sizes",
        "1,8,32",
        "--criu",
        "/x/criu",
        "--no-emulated",
        "--out",
        "/o",
        "--svg",
        "/s.svg",
        "--world-dir",
        "/w",
        "--configs",
        "driver-api, plain",
    ])
    .unwrap();
    assert!(o.bench && !o.emulated && o.scenarios && !o.no_svg && !o.list);
    assert_eq!((o.rounds, o.sizes.clone()), (3, vec![1, 8, 32]));
    assert_eq!(o.criu, Some("/x/criu".into()));
    assert_eq!(o.out, Some("/o".into()));
    assert_eq!(o.svg, Some("/s.svg".into()));
    assert_eq!(o.world_dir, Some("/w".into()));
    assert_eq!(o.configs, Some(vec![Config::Driver, Config::Plain]));
    let o = opts(&["--bench"]).unwrap();
    assert_eq!((o.rounds, o.sizes), (5, vec![1, 8, 32]));
    assert!(o.emulated && o.scenarios && !o.no_svg && o.configs.is_none());
    // The last of a repeated option wins, as before.
    assert_eq!(opts(&["--rounds", "2", "--rounds", "4"]).unwrap().rounds, 4);
}

#[test]
fn libtest_arguments_are_accepted_and_ignored() {
    let args = [
        "--bench",
        "--nocapture",
        "--test-threads",
        "2",
        "--exact",
        "--format",
        "terse",
        "criu_bench_smoke",
    ];
    let a = Args::try_parse_from(std::iter::once("criu_bench").chain(args)).unwrap();
    assert_eq!(
        a.libtest.given(),
        [
            "--nocapture",
            "--exact",
            "--test-threads 2",
            "--format terse",
            "criu_bench_smoke"
        ]
    );
    let o = Opts::resolve(a).unwrap();
    assert!(o.bench && o.rounds == 5);
    assert!(
        opts(&["--list", "--format", "terse", "--ignored"])
            .unwrap()
            .list
    );
}

#[test]
fn bad_values_are_refused() {
    assert!(opts(&["--rounds", "0"]).is_err());
    assert!(opts(&["--sizes", "1,0"]).is_err());
    assert!(opts(&["--sizes", "x"]).is_err());
    let e = opts(&["--configs", "driver-api,nope"]).unwrap_err();
    assert!(e.contains("unknown configuration \"nope\""), "{e}");
}

/// Images CRIU 4.1.1 and 4.2.1 wrote for an 8-task tree (`driver-api` and
/// `cuda-checkpoint`), with the values the benchmark's earlier hand-written decoder read
/// from them.
#[test]
fn decodes_the_stats_images_of_real_criu() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/criu_bench/testdata");
    let got = CriuStats::of_images(&dir.join("criu-4.2.1"));
    let want = CriuStats {
        freezing: 112.845,
        frozen: 99.444,
        memdump: 10.781,
        memwrite: 2.822,
        pages: 995.0,
        forking: 0.178,
        restore: 37.08,
    };
    assert_eq!(got, want);
    let got = CriuStats::of_images(&dir.join("criu-4.1.1"));
    let want = CriuStats {
        freezing: 25.949,
        frozen: 94.641,
        memdump: 13.193,
        memwrite: 2.937,
        pages: 1009.0,
        forking: 0.292,
        restore: 25.775,
    };
    assert_eq!(got, want);

    let d = read_stats(&dir.join("criu-4.2.1/stats-dump")).unwrap();
    assert!(d.restore.is_none());
    let d = d.dump.unwrap();
    assert_eq!(
        (d.pages_scanned, d.pages_skipped_parent, d.irmap_resolve),
        (1194, 0, Some(0))
    );
    assert_eq!((d.page_pipes, d.page_pipe_bufs), (Some(64), Some(64)));
    let r = read_stats(&dir.join("criu-4.2.1/stats-restore")).unwrap();
    assert!(r.dump.is_none());
    assert_eq!(r.restore.unwrap().pages_restored, Some(995));
}

#[test]
fn takes_either_framing_and_refuses_others() {
    let entry = StatsEntry {
        dump: None,
        restore: Some(RestoreStatsEntry {
            forking_time: 1500,
            restore_time: 2500,
            ..Default::default()
        }),
    };
    let body = prost::Message::encode_to_vec(&entry);
    let len = (body.len() as u32).to_le_bytes();
    let alone = [&STATS_MAGIC.to_le_bytes()[..], &len, &body].concat();
    let after_img = [&0x5510_5940u32.to_le_bytes()[..], &alone].concat();
    assert_eq!(decode_stats(&alone), Some(entry.clone()));
    assert_eq!(decode_stats(&after_img), Some(entry));
    assert_eq!(decode_stats(&[0; 16]), None);
    assert_eq!(decode_stats(&alone[..alone.len() - 1]), None);
    assert_eq!(decode_stats(&[]), None);
    let missing = CriuStats::of_images(Path::new("/nonexistent"));
    assert_eq!(missing, CriuStats::default());
}
