//! The checkpoint state machine against a model (proptest).
//!
//! The test process is its own target (the driver allows a process to checkpoint itself): it
//! creates contexts on two GPUs with one allocation each, then random sequences of lock,
//! checkpoint, restore (without pairs, with identity pairs, with swapped pairs, with a bad map)
//! and unlock, plus calls with reserved bytes set, are checked against the documented state
//! machine: the result code of every call, the state after it, and the GPU data whenever the
//! process runs.

mod common;

use abi::{CUcheckpointLockArgs, CUcheckpointUnlockArgs, CUprocessState, CUresult, GpuUuid};
use common::*;
use mock_libcuda::{driver, ffi::exports};
use proptest::prelude::*;
use std::sync::OnceLock;
use testkit::world::{GPU0, GPU1};

#[derive(Debug, Clone, Copy)]
enum Pairs {
    None,
    Identity,
    Swapped,
    Incomplete,
}

#[derive(Debug, Clone, Copy)]
enum Step {
    Lock,
    Checkpoint,
    Restore(Pairs),
    Unlock,
    LockReserved,
    UnlockReserved,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => Just(Step::Lock),
        3 => Just(Step::Checkpoint),
        1 => Just(Step::Restore(Pairs::None)),
        1 => Just(Step::Restore(Pairs::Identity)),
        1 => Just(Step::Restore(Pairs::Swapped)),
        1 => Just(Step::Restore(Pairs::Incomplete)),
        3 => Just(Step::Unlock),
        1 => Just(Step::LockReserved),
        1 => Just(Step::UnlockReserved),
    ]
}

const BYTES: usize = 4096;

struct Fixture {
    _world: TestWorld,
    pid: i32,
    /// (context handle, device pointer, expected bytes) per allocation.
    allocs: Vec<(usize, u64, Vec<u8>)>,
}

fn fixture() -> &'static std::sync::Mutex<Fixture> {
    static F: OnceLock<std::sync::Mutex<Fixture>> = OnceLock::new();
    F.get_or_init(|| {
        let world = TestWorld::new(&config(580, ""));
        driver::init(0).unwrap();
        let mut allocs = Vec::new();
        for dev in 0..2 {
            let ctx = driver::ctx_create("cuCtxCreate", dev).unwrap();
            let dptr = driver::mem_alloc(BYTES as u64).unwrap();
            let data: Vec<u8> = (0..BYTES)
                .map(|i| (i * 7 + dev as usize * 3) as u8)
                .collect();
            driver::memcpy_htod(dptr, &data).unwrap();
            allocs.push((ctx, dptr, data));
        }
        std::sync::Mutex::new(Fixture {
            _world: world,
            pid: std::process::id() as i32,
            allocs,
        })
    })
}

fn pairs(p: Pairs) -> Vec<(GpuUuid, GpuUuid)> {
    let (g0, g1) = (GpuUuid::parse(GPU0).unwrap(), GpuUuid::parse(GPU1).unwrap());
    match p {
        Pairs::None => vec![],
        Pairs::Identity => vec![(g0, g0), (g1, g1)],
        Pairs::Swapped => vec![(g0, g1), (g1, g0)],
        Pairs::Incomplete => vec![(g0, g1)],
    }
}

/// The documented machine: (expected result, state after).
fn model(state: CUprocessState, s: Step) -> (CUresult, CUprocessState) {
    use CUprocessState as S;
    let illegal = (CUresult::ERROR_ILLEGAL_STATE, state);
    match s {
        Step::LockReserved | Step::UnlockReserved => (CUresult::ERROR_INVALID_VALUE, state),
        Step::Lock if state == S::RUNNING => (CUresult::SUCCESS, S::LOCKED),
        Step::Checkpoint if state == S::LOCKED => (CUresult::SUCCESS, S::CHECKPOINTED),
        Step::Restore(Pairs::Incomplete) if state == S::CHECKPOINTED => {
            (CUresult::ERROR_INVALID_VALUE, state)
        }
        Step::Restore(_) if state == S::CHECKPOINTED => (CUresult::SUCCESS, S::LOCKED),
        Step::Unlock if state == S::LOCKED => (CUresult::SUCCESS, S::RUNNING),
        _ => illegal,
    }
}

fn code(r: Result<(), CUresult>) -> CUresult {
    r.err().unwrap_or(CUresult::SUCCESS)
}

fn run(pid: i32, s: Step) -> CUresult {
    match s {
        Step::Lock => code(driver::lock(pid, 2000)),
        Step::Checkpoint => code(driver::checkpoint(pid)),
        Step::Restore(p) => code(driver::restore(pid, &pairs(p))),
        Step::Unlock => code(driver::unlock(pid)),
        Step::LockReserved => {
            let mut a = CUcheckpointLockArgs {
                reserved0: 1,
                ..Default::default()
            };
            // SAFETY: a valid args struct for the duration of the call.
            unsafe { exports::cuCheckpointProcessLock(pid, &mut a) }
        }
        Step::UnlockReserved => {
            let mut a = CUcheckpointUnlockArgs::default();
            a.reserved[7] = 9;
            // SAFETY: a valid args struct for the duration of the call.
            unsafe { exports::cuCheckpointProcessUnlock(pid, &mut a) }
        }
    }
}

/// Drives the process back to RUNNING (the shortest legal way).
fn reset(pid: i32) {
    for _ in 0..3 {
        match driver::get_state(pid).unwrap() {
            CUprocessState::CHECKPOINTED => driver::restore(pid, &[]).unwrap(),
            CUprocessState::LOCKED => driver::unlock(pid).unwrap(),
            _ => return,
        }
    }
}

fn verify(f: &Fixture) {
    for (ctx, dptr, want) in &f.allocs {
        driver::ctx_set_current(*ctx).unwrap();
        let mut got = vec![0u8; BYTES];
        driver::memcpy_dtoh(&mut got, *dptr).unwrap();
        assert!(&got == want, "GPU data changed across the state machine");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn checkpoint_state_machine_matches_the_model(steps in proptest::collection::vec(step(), 1..14)) {
        let _s = serial();
        let f = fixture().lock().unwrap();
        reset(f.pid);
        let mut state = CUprocessState::RUNNING;
        for s in steps {
            let (want_code, want_state) = model(state, s);
            let got = run(f.pid, s);
            prop_assert_eq!(got, want_code, "{:?} in {}", s, state);
            state = want_state;
            prop_assert_eq!(driver::get_state(f.pid), Ok(state), "state after {:?}", s);
            if state == CUprocessState::RUNNING {
                verify(&f);
            }
        }
        reset(f.pid);
        verify(&f);
    }
}
