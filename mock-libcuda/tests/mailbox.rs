//! The restore thread's mailbox: a doorbell (futex in a shared file mapping) wakes the
//! thread and the caller; with `MOCK_CUDA_MAILBOX=poll` the thread polls instead. Both must
//! carry out exactly the same requests. (A file of its own: it calls `cuInit`, which is
//! process-wide, and `api.rs` checks calls made before it.)

mod common;

use abi::CUprocessState;
use common::*;
use mock_libcuda::driver;

#[test]
fn doorbell_and_polled_mailboxes_serve_the_same_requests() {
    let _s = serial();
    let mut w = TestWorld::new(&config(580, ""));
    let rung = w.spawn_app(&["--kib", "16"]);
    let polled = w.spawn_app_env(
        &["--kib", "16"],
        &[(mock_libcuda::target::MAILBOX_ENV, "poll")],
    );
    // Mailboxes are filed by world id.
    let bell = |pid: i32| {
        let id = w.world.read_state().unwrap().by_pid(pid).unwrap().0;
        w.path().join(format!("mailbox/{id}/bell"))
    };
    assert!(bell(rung).is_file(), "a target has a doorbell by default");
    assert!(
        !bell(polled).exists(),
        "MOCK_CUDA_MAILBOX=poll: no doorbell, callers poll the mailbox"
    );
    driver::init(0).unwrap();
    // Interleaved, so each side's requests and answers cross the other's.
    for _ in 0..3 {
        for pid in [rung, polled] {
            driver::lock(pid, 2000).unwrap();
        }
        for pid in [rung, polled] {
            driver::checkpoint(pid).unwrap();
            assert_eq!(driver::get_state(pid), Ok(CUprocessState::CHECKPOINTED));
        }
        for pid in [rung, polled] {
            driver::restore(pid, &[]).unwrap();
            driver::unlock(pid).unwrap();
            assert_eq!(driver::get_state(pid), Ok(CUprocessState::RUNNING));
        }
    }
    assert!(w.verify(0, rung).starts_with("PASS"));
    assert!(w.verify(1, polled).starts_with("PASS"));
}
