//! The engine emulation against C test plugins compiled at test time and real process trees.

mod common;

use common::{failed, lines_with, ok, run, Fixture, Tree};

// ---------------------------------------------------------------- loader

#[test]
fn plugins_load_in_readdir_order_and_exit_in_load_order() {
    let fx = Fixture::new();
    for n in ["p1", "p2", "p3", "p4"] {
        fx.plugin(&format!("lib{n}.so"), n, &[]);
    }
    fx.plugin("ignored.so.1", "ignored", &[]);
    fx.empty_image(None);
    let out = run(fx.cmd("pr3076", "restore"));
    ok(&out, &fx.log());
    let order: Vec<String> = fx
        .readdir_order()
        .iter()
        .map(|f| {
            f.trim_start_matches("lib")
                .trim_end_matches(".so")
                .to_owned()
        })
        .collect();
    let log = fx.take_tp_log();
    let inits: Vec<&str> = lines_with(&log, "init stage=2")
        .iter()
        .map(|l| l.split(' ').next().unwrap())
        .collect();
    let exits: Vec<&str> = lines_with(&log, "exit stage=2 ret=0")
        .iter()
        .map(|l| l.split(' ').next().unwrap())
        .collect();
    assert_eq!(inits, order);
    assert_eq!(exits, order);
    assert!(
        lines_with(&log, "ignored").is_empty(),
        "foo.so.1 must not load"
    );
}

#[test]
fn max_hooks_above_host_limit_is_rejected_before_init() {
    let fx = Fixture::new();
    fx.plugin("a.so", "a", &["TP_NO_CLAMP"]);
    fx.empty_image(None);
    let out = run(fx.cmd("4.1", "restore"));
    failed(&out, &fx.log());
    let log = fx.log();
    assert!(
        log.contains("Plugin a has 17 assigned while max 12 supported"),
        "{log}"
    );
    assert!(log.contains("Corrupted plugin"), "{log}");
    let tp = fx.take_tp_log();
    assert_eq!(tp, ["a ctor max_hooks=17"], "neither init nor exit may run");

    // The same library clamps itself from cr_plugin_ctl's size and loads on every host.
    fx.plugin("a.so", "a", &[]);
    for (host, hooks) in [("4.1", 12), ("4.2", 13), ("upstream", 16), ("pr3076", 17)] {
        let out = run(fx.cmd(host, "restore"));
        ok(&out, &fx.log());
        assert!(fx
            .log()
            .contains(&format!("Plugin \"a\" (version 512 hooks {hooks})")));
        fx.take_tp_log();
    }
}

#[test]
fn newer_descriptor_version_is_rejected_except_by_pr3076() {
    let fx = Fixture::new();
    fx.plugin("a.so", "a", &["TP_VERSION=0x300"]);
    fx.empty_image(None);
    let out = run(fx.cmd("upstream", "restore"));
    failed(&out, &fx.log());
    assert!(
        fx.log().contains("has version 300 while max 200 supported"),
        "{}",
        fx.log()
    );
    let out = run(fx.cmd("pr3076", "restore"));
    ok(&out, &fx.log());
    let out = run(fx.cmd("pr3076", "restore").env("TP_a_VERSION", "0x301"));
    failed(&out, &fx.log());
}

#[test]
fn library_without_descriptor_is_ignored_with_a_warning() {
    let fx = Fixture::new();
    fx.plugin("legacy.so", "legacy", &["TP_NO_DESC"]);
    fx.plugin("a.so", "a", &[]);
    fx.empty_image(None);
    let out = run(fx.cmd("4.1", "restore"));
    ok(&out, &fx.log());
    assert!(
        fx.log()
            .contains("Generating dynamic descriptor for plugin"),
        "{}",
        fx.log()
    );
    let tp = fx.take_tp_log();
    assert!(lines_with(&tp, "legacy").is_empty(), "{tp:?}");
    assert_eq!(lines_with(&tp, "a init").len(), 1);
}

#[test]
fn broken_library_fails_the_run_and_untouched_tree_keeps_running() {
    let fx = Fixture::new();
    std::fs::write(fx.lib().join("broken.so"), "not an ELF file\n").unwrap();
    let tree = Tree::single();
    let out = run(fx
        .cmd("pr3076", "dump")
        .args(["-t", &tree.root().to_string()]));
    failed(&out, &fx.log());
    assert!(fx.log().contains("Unable to load"), "{}", fx.log());
    assert!(fx.log().contains("Dumping FAILED."));
    tree.assert_running();
}

#[test]
fn failed_init_drops_that_plugin_without_exit_and_finalises_the_others() {
    let fx = Fixture::new();
    for n in ["p1", "p2", "p3"] {
        fx.plugin(&format!("{n}.so"), n, &[]);
    }
    let order: Vec<String> = fx
        .readdir_order()
        .iter()
        .map(|f| f.trim_end_matches(".so").to_owned())
        .collect();
    let (first, bad, never) = (&order[0], &order[1], &order[2]);
    let tree = Tree::single();
    let out = run(fx
        .cmd("pr3076", "dump")
        .args(["-t", &tree.root().to_string()])
        .env(format!("TP_{bad}_init"), "ret=-1"));
    failed(&out, &fx.log());
    assert!(fx
        .log()
        .contains(&format!("Failed in init(0) of \"{bad}\"")));
    let tp = fx.take_tp_log();
    assert!(
        tp.contains(&format!("{first} exit stage=0 ret=-1")),
        "{tp:?}"
    );
    assert!(lines_with(&tp, &format!("{bad} exit")).is_empty(), "{tp:?}");
    assert!(
        lines_with(&tp, never).is_empty(),
        "later plugins are never opened: {tp:?}"
    );
    assert!(lines_with(&tp, "PAUSE_DEVICES").is_empty());
    tree.assert_running();
}

#[test]
fn hooks_nulled_in_init_are_not_chained() {
    let fx = Fixture::new();
    fx.plugin("a.so", "a", &[]);
    let tree = Tree::single();
    let out = run(fx
        .cmd("pr3076", "dump")
        .args(["-t", &tree.root().to_string(), "-R"])
        .env("TP_a_init", "null"));
    ok(&out, &fx.log());
    let tp = fx.take_tp_log();
    assert!(lines_with(&tp, "PAUSE").is_empty(), "{tp:?}");
    assert!(tp.contains(&"a exit stage=0 ret=0".to_owned()));
}

// ---------------------------------------------------------------- host services

#[test]
fn host_symbols_match_each_profile() {
    let fx = Fixture::new();
    fx.plugin("a.so", "a", &[]);
    fx.empty_image(None);
    for (host, ctl, has_query, options) in [
        ("4.1", 208, false, false),
        ("4.2", 224, false, false),
        ("upstream", 272, true, true),
        ("pr3076", 288, true, true),
    ] {
        let out = run(fx
            .cmd(host, "restore")
            .env("TP_a_init", "host,has=a,opts")
            .env("CRIU_FAULT", "138"));
        ok(&out, &fx.log());
        let tp = fx.take_tp_log();
        assert!(
            tp.contains(&format!(
                "a host final_state=2 timeout=10 fi=138 ctl={ctl} imgdir=1"
            )),
            "{host}: {tp:?}"
        );
        assert_eq!(
            tp.contains(&"a has a = absent".to_owned()),
            !has_query,
            "{host}: {tp:?}"
        );
        assert_eq!(
            tp.contains(&"a opts absent".to_owned()),
            !options,
            "{host}: {tp:?}"
        );
    }
}

#[test]
fn options_are_handed_in_order_with_repeats_and_each_caller_gets_its_own_copy() {
    let fx = Fixture::new();
    fx.plugin("a.so", "a", &[]);
    fx.plugin("b.so", "b", &[]);
    fx.empty_image(None);
    let out = run(fx
        .cmd("pr3076", "restore")
        .args(["--plugin-option", "cuda_plugin.backend=auto"])
        .args(["--plugin-option", "b.flag"])
        .args(["--plugin-option", "cuda_plugin.backend=driver-api"])
        .args(["--plugin-option", "a.empty="])
        .env("TP_a_init", "permute,opts")
        .env("TP_b_init", "permute,opts"));
    ok(&out, &fx.log());
    let tp = fx.take_tp_log();
    let want = "opts ret=0 argc=5 [criu-plugin] [--cuda_plugin.backend=auto] [--b.flag] [--cuda_plugin.backend=driver-api] [--a.empty=] null=1";
    assert!(tp.contains(&format!("a {want}")), "{tp:?}");
    assert!(tp.contains(&format!("b {want}")), "{tp:?}");

    // No options: argv[0] alone.
    let out = run(fx.cmd("pr3076", "restore").env("TP_a_init", "opts"));
    ok(&out, &fx.log());
    assert!(fx
        .take_tp_log()
        .contains(&"a opts ret=0 argc=1 [criu-plugin] null=1".to_owned()));
}

#[test]
fn malformed_or_unsupported_plugin_options_are_refused() {
    let fx = Fixture::new();
    fx.empty_image(None);
    for bad in ["backend=auto", ".x", "p.", "p.=v"] {
        let out = run(fx.cmd("pr3076", "restore").args(["--plugin-option", bad]));
        assert_eq!(out.status.code(), Some(2), "{bad} must be a usage error");
    }
    let out = run(fx.cmd("4.1", "restore").args(["--plugin-option", "a.b=c"]));
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no --plugin-option"));
}

// ---------------------------------------------------------------- dispatch rules

#[test]
fn chained_hooks_stop_at_the_first_result_other_than_enotsup() {
    let fx = Fixture::new();
    fx.plugin("p1.so", "p1", &[]);
    fx.plugin("p2.so", "p2", &[]);
    let order = fx.readdir_order();
    let (first, second) = (
        order[0].trim_end_matches(".so"),
        order[1].trim_end_matches(".so"),
    );
    let tree = Tree::single();
    let root = tree.root().to_string();

    // Both return 0: the second never sees the task.
    let out = run(fx.cmd("pr3076", "dump").args(["-t", &root, "-R"]));
    ok(&out, &fx.log());
    let tp = fx.take_tp_log();
    assert_eq!(lines_with(&tp, &format!("{first} PAUSE_DEVICES")).len(), 1);
    assert!(
        lines_with(&tp, &format!("{second} PAUSE_DEVICES")).is_empty(),
        "{tp:?}"
    );
    assert!(lines_with(&tp, &format!("{second} CHECKPOINT_DEVICES")).is_empty());

    // The first declines with -ENOTSUP: the second handles it.
    let out = run(fx
        .cmd("pr3076", "dump")
        .args(["-t", &root, "-R"])
        .env(format!("TP_{first}_pause"), "ret=-95")
        .env(format!("TP_{first}_checkpoint"), "ret=-95"));
    ok(&out, &fx.log());
    let tp = fx.take_tp_log();
    assert_eq!(lines_with(&tp, &format!("{first} PAUSE_DEVICES")).len(), 1);
    assert_eq!(lines_with(&tp, &format!("{second} PAUSE_DEVICES")).len(), 1);
    assert_eq!(
        lines_with(&tp, &format!("{second} CHECKPOINT_DEVICES")).len(),
        1
    );
    tree.assert_running();
}

#[test]
fn global_hooks_are_broadcast_under_newer_rules_and_chained_under_41_rules() {
    let fx = Fixture::new();
    fx.plugin("p1.so", "p1", &[]);
    fx.plugin("p2.so", "p2", &[]);
    fx.empty_image(None);
    let out = run(fx.cmd("upstream", "restore"));
    ok(&out, &fx.log());
    assert_eq!(lines_with(&fx.take_tp_log(), "RESTORE_INIT").len(), 2);

    let out = run(fx.cmd("upstream", "restore").args(["--rules", "4.1"]));
    ok(&out, &fx.log());
    assert_eq!(lines_with(&fx.take_tp_log(), "RESTORE_INIT").len(), 1);

    // 4.1 has no such hook at all.
    let out = run(fx.cmd("4.1", "restore"));
    ok(&out, &fx.log());
    assert!(lines_with(&fx.take_tp_log(), "RESTORE_INIT").is_empty());
}

#[test]
fn broadcast_runs_every_handler_and_returns_the_first_real_error() {
    let fx = Fixture::new();
    fx.plugin("p1.so", "p1", &[]);
    fx.plugin("p2.so", "p2", &[]);
    let order = fx.readdir_order();
    let (first, second) = (
        order[0].trim_end_matches(".so"),
        order[1].trim_end_matches(".so"),
    );
    let tree = Tree::single();
    let out = run(fx
        .cmd("pr3076", "dump")
        .args(["-t", &tree.root().to_string()])
        .env(format!("TP_{first}_dlate"), "ret=-5")
        .env(format!("TP_{second}_dlate"), "ret=-7"));
    failed(&out, &fx.log());
    assert!(
        fx.log().contains("DUMP_DEVICES_LATE failed with -5"),
        "{}",
        fx.log()
    );
    let tp = fx.take_tp_log();
    assert_eq!(lines_with(&tp, "DUMP_DEVICES_LATE").len(), 2);
    // DUMP_FINISH and exit see the failure while the tree is still frozen; then it runs again.
    assert!(
        tp.contains(&format!("{first} DUMP_FINISH -1 -> 0")),
        "{tp:?}"
    );
    assert!(
        tp.contains(&format!("{second} exit stage=0 ret=-1")),
        "{tp:?}"
    );
    tree.assert_running();
    assert!(!fx.img().join("inventory.json").exists());
}

#[test]
fn resume_devices_late_error_aborts_restore_under_newer_rules_only() {
    for (host, fatal) in [("pr3076", true), ("4.1", false), ("4.2", false)] {
        let fx = Fixture::new();
        fx.plugin("a.so", "a", &[]);
        let tree = Tree::single();
        let out = run(fx.cmd(host, "dump").args(["-t", &tree.root().to_string()]));
        ok(&out, &fx.log());
        tree.assert_parked();
        let out = run(fx.cmd(host, "restore").env("TP_a_resume", "ret=-1"));
        if fatal {
            failed(&out, &fx.log());
            assert!(fx
                .take_tp_log()
                .contains(&"a exit stage=2 ret=-1".to_owned()));
            // A failed restore leaves the image's tasks as they were: parked, untraced.
            tree.assert_parked();
            let out = run(fx.cmd(host, "restore"));
            ok(&out, &fx.log());
        } else {
            ok(&out, &fx.log());
            assert!(fx
                .log()
                .contains("restore late stage hook for external plugin failed"));
            assert!(fx
                .take_tp_log()
                .contains(&"a exit stage=2 ret=0".to_owned()));
        }
        tree.assert_running();
    }
}

// ---------------------------------------------------------------- the #3105 sentinel

/// The hook lines (`hook NAME plugin pid=... -> ret`) of a trace, in order.
fn hook_lines(trace: &[String], hook: &str) -> Vec<String> {
    trace
        .iter()
        .filter(|l| l.starts_with(&format!("hook {hook} ")))
        .cloned()
        .collect()
}

#[test]
fn the_sentinel_calls_each_device_loop_once_more_with_pid_minus_1_after_its_last_task() {
    let fx = Fixture::new();
    fx.plugin("a.so", "a", &[]);
    let tree = Tree::spawn(&fx);
    let root = tree.root().to_string();

    // Without the switch (every released CRIU): no call for pid -1.
    ok(
        &run(fx.cmd("pr3076", "dump").args(["-t", &root])),
        &fx.log(),
    );
    ok(&run(fx.cmd("pr3076", "restore")), &fx.log());
    let tp = fx.take_tp_log();
    assert!(lines_with(&tp, "_DEVICES -1 ").is_empty(), "{tp:?}");
    assert!(lines_with(&tp, "_LATE -1 ").is_empty(), "{tp:?}");
    fx.take_trace();

    for host in ["4.1", "4.2", "upstream", "pr3076"] {
        let out = run(fx
            .cmd(host, "dump")
            .args(["-t", &root, "--device-sentinel"]));
        ok(&out, &fx.log());
        tree.assert_parked();
        let out = run(fx.cmd(host, "restore").arg("--device-sentinel"));
        ok(&out, &fx.log());
        tree.assert_running();
        let tp = fx.take_tp_log();
        let trace = fx.take_trace();
        assert!(
            trace
                .iter()
                .any(|l| l.ends_with("rules=4.1 sentinel") || l.ends_with("rules=newer sentinel")),
            "{host}: {trace:?}"
        );
        // The tasks in tree order, then the sentinel: once per loop, last, with pid -1.
        let pids: Vec<String> = tree.pids.iter().map(ToString::to_string).collect();
        for (label, hook) in [
            ("CHECKPOINT_DEVICES", "checkpoint"),
            ("RESUME_DEVICES_LATE", "resume"),
        ] {
            let calls: Vec<&str> = lines_with(&tp, &format!("a {label} "))
                .iter()
                .map(|l| l.split(' ').nth(2).unwrap())
                .collect();
            let mut want: Vec<&str> = pids.iter().map(String::as_str).collect();
            want.push("-1");
            assert_eq!(calls, want, "{host} {hook}: {tp:?}");
            let hooks = hook_lines(&trace, label);
            assert_eq!(hooks.len(), 5, "{host}: {trace:?}");
            assert_eq!(hooks[4], format!("hook {label} a pid=-1 -> 0"), "{host}");
        }
        // Where: the dump's sentinel comes right after the loop, before the files are dumped
        // and before DUMP_DEVICES_LATE; the restore's before the tree is released.
        let at = |needle: &str| {
            trace
                .iter()
                .position(|l| l.starts_with(needle))
                .unwrap_or_else(|| panic!("{host}: no `{needle}` in {trace:?}"))
        };
        let ck = at("hook CHECKPOINT_DEVICES a pid=-1");
        assert_eq!(
            trace[ck - 1],
            "hook CHECKPOINT_DEVICES a pid=#3 -> 0",
            "{host}"
        );
        let released = trace
            .iter()
            .enumerate()
            .filter(|(_, l)| l.starts_with("released "))
            .map(|(i, _)| i)
            .collect::<Vec<_>>();
        assert!(ck < released[0], "{host}: {trace:?}");
        if ["upstream", "pr3076"].contains(&host) {
            assert!(ck < at("hook DUMP_DEVICES_LATE"), "{host}: {trace:?}");
        }
        let rs = at("hook RESUME_DEVICES_LATE a pid=-1");
        assert_eq!(
            trace[rs - 1],
            "hook RESUME_DEVICES_LATE a pid=#3 -> 0",
            "{host}"
        );
        assert!(rs < released[1], "{host}: {trace:?}");
    }
}

#[test]
fn the_sentinel_result_is_checked_as_a_task_result_of_its_loop() {
    let fx = Fixture::new();
    fx.plugin("a.so", "a", &[]);
    let tree = Tree::spawn(&fx);
    let root = tree.root().to_string();
    let dump = |host: &str, spec: &str| {
        run(fx
            .cmd(host, "dump")
            .args(["-t", &root, "--device-sentinel"])
            .env("TP_a_checkpoint", spec))
    };

    // -ENOTSUP (a plugin that does not use it) is ignored: the dump goes on.
    for host in ["4.2", "pr3076"] {
        ok(&dump(host, "retat=5:-95"), &fx.log());
        tree.assert_parked();
        let tp = fx.take_tp_log();
        assert!(
            tp.contains(&"a CHECKPOINT_DEVICES -1 -> -95".to_owned()),
            "{tp:?}"
        );
        assert!(tp.contains(&"a exit stage=0 ret=0".to_owned()), "{tp:?}");
        ok(&run(fx.cmd(host, "restore")), &fx.log());
        tree.assert_running();
        fx.take_tp_log();
    }

    // Another error fails the dump, on every host: the tree runs again.
    for host in ["4.2", "pr3076"] {
        failed(&dump(host, "retat=5:-5"), &fx.log());
        let log = fx.log();
        assert!(
            log.contains("CHECKPOINT_DEVICES failed with -5 for task -1"),
            "{host}: {log}"
        );
        let tp = fx.take_tp_log();
        assert!(tp.contains(&"a exit stage=0 ret=-1".to_owned()), "{tp:?}");
        tree.assert_running();
        assert!(!fx.img().join("inventory.json").exists());
    }

    // A loop that stops at a task's error never reaches the sentinel.
    failed(&dump("pr3076", "retat=2:-5"), &fx.log());
    let tp = fx.take_tp_log();
    assert_eq!(lines_with(&tp, "a CHECKPOINT_DEVICES").len(), 2, "{tp:?}");
    assert!(
        lines_with(&tp, "CHECKPOINT_DEVICES -1").is_empty(),
        "{tp:?}"
    );
    tree.assert_running();

    // RESUME_DEVICES_LATE(-1): an error fails the restore under the newer rules, where a task's
    // error does; under the 4.1 rules it is only logged, as a task's is.
    for (host, fatal) in [("pr3076", true), ("4.2", false)] {
        ok(&dump(host, ""), &fx.log());
        tree.assert_parked();
        fx.take_tp_log();
        let out = run(fx
            .cmd(host, "restore")
            .arg("--device-sentinel")
            .env("TP_a_resume", "retat=5:-5"));
        let tp = fx.take_tp_log();
        assert!(
            tp.contains(&"a RESUME_DEVICES_LATE -1 -> -5".to_owned()),
            "{tp:?}"
        );
        if fatal {
            failed(&out, &fx.log());
            assert!(
                fx.log()
                    .contains("RESUME_DEVICES_LATE failed with -5 for task -1"),
                "{}",
                fx.log()
            );
            tree.assert_parked();
            ok(&run(fx.cmd(host, "restore")), &fx.log());
            fx.take_tp_log();
        } else {
            ok(&out, &fx.log());
            assert!(fx
                .log()
                .contains("restore late stage hook for external plugin failed"));
        }
        tree.assert_running();
    }
}

// ---------------------------------------------------------------- inventory

#[test]
fn inventory_names_match_by_prefix_under_41_rules_and_exactly_under_newer_rules() {
    let fx = Fixture::new();
    fx.plugin("a.so", "inv", &[]);
    fx.empty_image(Some(&["inv_extra"]));
    let out = run(fx.cmd("4.1", "restore").env("TP_inv_init", "check=inv"));
    ok(&out, &fx.log());
    assert!(fx.take_tp_log().contains(&"inv check inv = 1".to_owned()));

    let out = run(fx
        .cmd("pr3076", "restore")
        .env("TP_inv_init", "has=inv_extra,has=inv,check=inv"));
    failed(&out, &fx.log());
    let tp = fx.take_tp_log();
    assert!(tp.contains(&"inv has inv_extra = 1".to_owned()), "{tp:?}");
    assert!(tp.contains(&"inv has inv = 0".to_owned()), "{tp:?}");
    assert!(tp.contains(&"inv check inv = 0".to_owned()), "{tp:?}");
    assert!(fx.log().contains("Missing required plugin: inv_extra"));
    assert!(tp.contains(&"inv exit stage=2 ret=-1".to_owned()), "{tp:?}");
}

#[test]
fn restore_fails_when_a_listed_plugin_is_missing_or_unclaimed() {
    let fx = Fixture::new();
    fx.empty_image(Some(&["gone"]));
    failed(&run(fx.cmd("pr3076", "restore")), &fx.log());
    assert!(fx.log().contains("Missing required plugin: gone"));
    fx.plugin("a.so", "a", &[]);
    fx.empty_image(Some(&["a"]));
    failed(&run(fx.cmd("pr3076", "restore")), &fx.log());
    ok(
        &run(fx.cmd("pr3076", "restore").env("TP_a_init", "check=a")),
        &fx.log(),
    );
    // An image without a plugin list (older format) accepts anything.
    fx.empty_image(None);
    ok(
        &run(fx.cmd("pr3076", "restore").env("TP_a_init", "has=zzz")),
        &fx.log(),
    );
    assert!(fx.take_tp_log().contains(&"a has zzz = 1".to_owned()));
}

#[test]
fn added_names_reach_the_image_inventory_in_criu_order() {
    let fx = Fixture::new();
    fx.plugin("a.so", "a", &[]);
    let tree = Tree::single();
    let out = run(fx
        .cmd("4.1", "dump")
        .args(["-t", &tree.root().to_string()])
        .env("TP_a_checkpoint", "add=first,add=second"));
    ok(&out, &fx.log());
    let inv: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fx.img().join("inventory.json")).unwrap())
            .unwrap();
    assert_eq!(inv["plugins"], serde_json::json!(["second", "first"]));
    assert_eq!(inv["tasks"][0]["pid"], tree.root());
}

// ---------------------------------------------------------------- images and streaming

#[test]
fn streamed_images_are_written_once_and_read_once_without_seek() {
    let fx = Fixture::new();
    fx.plugin("a.so", "a", &[]);
    let tree = Tree::single();
    let out = run(fx
        .cmd("pr3076", "dump")
        .args(["-t", &tree.root().to_string(), "--stream"])
        .env(
            "TP_a_checkpoint",
            "swrite=gpu.img:hello,swrite=gpu.img:again,fwrite=local.img:x",
        ));
    ok(&out, &fx.log());
    let tp = fx.take_tp_log();
    assert!(tp.contains(&"a swrite gpu.img = ok".to_owned()), "{tp:?}");
    assert!(tp.contains(&"a swrite gpu.img = -17".to_owned()), "{tp:?}");
    assert!(fx.img().join("stream.img").exists());

    let out = run(fx.cmd("pr3076", "restore").arg("--stream").env(
        "TP_a_resume",
        "sseek=gpu.img,sread=gpu.img,fread=local.img,sread=nope",
    ));
    ok(&out, &fx.log());
    let tp = fx.take_tp_log();
    assert!(tp.contains(&"a sseek gpu.img = -29".to_owned()), "{tp:?}");
    assert!(
        tp.contains(&"a sseek gpu.img = 'hello'".to_owned()),
        "{tp:?}"
    );
    assert!(
        tp.contains(&"a sread gpu.img = -2".to_owned()),
        "read once: {tp:?}"
    );
    assert!(tp.contains(&"a fread local.img = -2".to_owned()), "{tp:?}");
    assert!(tp.contains(&"a sread nope = -2".to_owned()), "{tp:?}");
    tree.assert_running();
}

#[test]
fn plain_images_live_in_the_image_directory() {
    let fx = Fixture::new();
    fx.plugin("a.so", "a", &[]);
    let tree = Tree::single();
    ok(
        &run(fx
            .cmd("4.1", "dump")
            .args(["-t", &tree.root().to_string()])
            .env("TP_a_checkpoint", "fwrite=a.img:data")),
        &fx.log(),
    );
    assert_eq!(
        std::fs::read_to_string(fx.img().join("a.img")).unwrap(),
        "data"
    );
    ok(
        &run(fx
            .cmd("4.1", "restore")
            .env("TP_a_resume", "fread=a.img,fread=a.img")),
        &fx.log(),
    );
    assert_eq!(
        lines_with(&fx.take_tp_log(), "fread a.img = 'data'").len(),
        2
    );
}

// ---------------------------------------------------------------- lifecycles on a real tree

#[test]
fn dump_freezes_the_whole_tree_in_dfs_order_and_releases_it() {
    let fx = Fixture::new();
    fx.plugin("a.so", "a", &[]);
    let tree = Tree::spawn(&fx);
    let [root, a, a1, b] = [tree.pids[0], tree.pids[1], tree.pids[2], tree.pids[3]];
    let out = run(fx
        .cmd("pr3076", "dump")
        .args(["-t", &root.to_string(), "--leave-running"])
        .env("TP_a_pause", "state")
        .env("TP_a_checkpoint", "state")
        .env("TP_a_init", "host"));
    ok(&out, &fx.log());
    let tp = fx.take_tp_log();
    let pauses: Vec<&str> = lines_with(&tp, "PAUSE_DEVICES");
    assert_eq!(
        pauses,
        [root, a, a1, b].map(|p| format!("a PAUSE_DEVICES {p} -> 0"))
    );
    // Before its own seize each task still runs; at CHECKPOINT the whole tree is stopped.
    let states: Vec<&str> = lines_with(&tp, "a state ");
    assert_eq!(&states[..4], ["a state S traced=0"; 4], "{tp:?}");
    assert_eq!(&states[4..], ["a state t traced=1"; 4], "{tp:?}");
    assert!(tp.contains(&"a host final_state=1 timeout=10 fi=0 ctl=288 imgdir=1".to_owned()));
    tree.assert_running();

    // Default final state: the tree is parked (stopped, untraced), then restore resumes it.
    ok(
        &run(fx.cmd("pr3076", "dump").args(["-t", &root.to_string()])),
        &fx.log(),
    );
    tree.assert_parked();
    let out = run(fx.cmd("pr3076", "restore").env("TP_a_resume", "state"));
    ok(&out, &fx.log());
    let tp = fx.take_tp_log();
    assert_eq!(lines_with(&tp, "a state t traced=1").len(), 4, "{tp:?}");
    assert_eq!(lines_with(&tp, "RESUME_DEVICES_LATE").len(), 4);
    tree.assert_running();
    let trace = fx.take_trace();
    assert!(
        trace.contains(&"hook PAUSE_DEVICES a pid=#2 -> 0".to_owned()),
        "{trace:?}"
    );
}

#[test]
fn a_thread_a_plugin_resumes_during_resume_devices_late_really_runs() {
    // The dump parks the tree in group-stop; a seized task in group-stop would drop straight back
    // into it when one thread is PTRACE_CONT'ed. The restore must hand plugins tasks whose
    // threads are in plain ptrace-stops, as a real CRIU restore does.
    let fx = Fixture::new();
    fx.plugin("a.so", "a", &[]);
    let tree = Tree::spawn(&fx);
    let b = tree.pids[3];
    for host in ["4.1", "pr3076"] {
        ok(
            &run(fx.cmd(host, "dump").args(["-t", &tree.root().to_string()])),
            &fx.log(),
        );
        tree.assert_parked();
        fx.take_tp_log();
        let out = run(fx
            .cmd(host, "restore")
            .env("TP_a_resume", "state,runthread"));
        ok(&out, &fx.log());
        let tp = fx.take_tp_log();
        let ran = lines_with(&tp, "runthread");
        assert_eq!(ran, ["a runthread ran=1"; 4], "{host}: {tp:?}");
        assert!(tp.contains(&format!("a RESUME_DEVICES_LATE {b} -> 0")));
        tree.assert_running();
    }

    // A failed restore leaves the tasks parked, as the dump did.
    ok(
        &run(fx
            .cmd("pr3076", "dump")
            .args(["-t", &tree.root().to_string()])),
        &fx.log(),
    );
    let out = run(fx
        .cmd("pr3076", "restore")
        .env("TP_a_resume", "runthread,retat=4:-1"));
    failed(&out, &fx.log());
    tree.assert_parked();
    ok(&run(fx.cmd("pr3076", "restore")), &fx.log());
    tree.assert_running();
}

#[test]
fn criu_functions_c_plugins_link_against_work_on_every_host() {
    // CRIU 4.1/4.2's cuda_plugin.c resumes a restore thread during CHECKPOINT_DEVICES and
    // RESUME_DEVICES_LATE and stops it again with PTRACE_INTERRUPT and compel_wait_task (its
    // get_status being parse_pid_status); it runs cuda-checkpoint in a child that calls
    // close_fds(3) first. amdgpu asks find_unused_fd_pid for a descriptor.
    let fx = Fixture::new();
    fx.plugin("a.so", "a", &[]);
    let tree = Tree::spawn(&fx);
    let actions = "compelwait,closefds,unusedfd";
    for host in ["4.1", "4.2", "upstream", "pr3076"] {
        let out = run(fx
            .cmd(host, "dump")
            .args(["-t", &tree.root().to_string()])
            .env("TP_a_checkpoint", actions));
        ok(&out, &fx.log());
        tree.assert_parked();
        let out = run(fx.cmd(host, "restore").env("TP_a_resume", actions));
        ok(&out, &fx.log());
        tree.assert_running();
        let tp = fx.take_tp_log();
        // Four tasks, one CHECKPOINT_DEVICES and one RESUME_DEVICES_LATE each.
        assert_eq!(
            lines_with(&tp, "a compelwait ret=1 state=t uid=1").len(),
            8,
            "{host}: COMPEL_TASK_ALIVE, a tracing stop, the credentials filled: {tp:?}"
        );
        assert_eq!(
            lines_with(&tp, "a closefds ok=1").len(),
            8,
            "{host}: {tp:?}"
        );
        assert_eq!(
            lines_with(&tp, "a unusedfd free=1").len(),
            8,
            "{host}: {tp:?}"
        );
    }
}

#[test]
fn restore_of_a_vanished_task_fails_cleanly() {
    let fx = Fixture::new();
    fx.plugin("a.so", "a", &[]);
    let tree = Tree::single();
    ok(
        &run(fx
            .cmd("pr3076", "dump")
            .args(["-t", &tree.root().to_string(), "-R"])),
        &fx.log(),
    );
    drop(tree);
    let out = run(fx.cmd("pr3076", "restore"));
    failed(&out, &fx.log());
    let tp = fx.take_tp_log();
    assert!(lines_with(&tp, "RESUME").is_empty());
    assert!(tp.contains(&"a exit stage=2 ret=-1".to_owned()));
}

// ---------------------------------------------------------------- plugins listing

#[test]
fn plugins_lists_descriptors_and_option_metadata_without_init() {
    let fx = Fixture::new();
    fx.plugin("cuda.so", "cuda_plugin", &["TP_META"]);
    fx.plugin("old.so", "old_meta", &["TP_META", "TP_META_VERSION=7"]);
    fx.plugin("legacy.so", "legacy", &["TP_NO_DESC"]);
    let out = std::process::Command::new(common::HARNESS)
        .args(["plugins", "--host", "4.1", "-L"])
        .arg(fx.lib())
        .env("TP_LOG", fx.path("tp.log"))
        .output()
        .unwrap();
    ok(&out, "");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("cuda_plugin (cuda.so): version 0x200, max_hooks 12"),
        "{text}"
    );
    assert!(
        text.contains("hooks: RESUME_DEVICES_LATE PAUSE_DEVICES CHECKPOINT_DEVICES\n"),
        "{text}"
    );
    assert!(text.contains(
        "--plugin-option=cuda_plugin.backend=auto|driver-api|cuda-checkpoint (default: auto)"
    ));
    assert!(text.contains("which backend checkpoints the GPU"));
    assert!(text.contains("--plugin-option=cuda_plugin.verbose\n"));
    assert!(text.contains("options: ignored (unsupported option metadata version 7)"));
    assert!(!text.contains("legacy"));
    let tp = fx.take_tp_log();
    assert!(
        tp.iter().all(|l| l.contains("ctor")),
        "init must not run: {tp:?}"
    );

    let out = std::process::Command::new(common::HARNESS)
        .args(["plugins", "--json", "-L"])
        .arg(fx.lib())
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 2);
}

#[test]
fn freeze_timeout_interrupts_a_slow_pause_and_fails_the_dump() {
    let fx = Fixture::new();
    fx.plugin("a.so", "a", &[]);
    let tree = Tree::single();
    let out = run(fx
        .cmd("pr3076", "dump")
        .args(["-t", &tree.root().to_string(), "--timeout", "1"])
        .env("TP_a_pause", "alarmed,sleep=3000,alarmed"));
    failed(&out, &fx.log());
    let tp = fx.take_tp_log();
    assert_eq!(lines_with(&tp, "alarmed = 0").len(), 1, "{tp:?}");
    assert_eq!(lines_with(&tp, "alarmed = 1").len(), 1, "{tp:?}");
    assert!(fx.log().contains("Timeout reached"), "{}", fx.log());
    assert!(tp.contains(&"a exit stage=0 ret=-1".to_owned()));
    tree.assert_running();
}
