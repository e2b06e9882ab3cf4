//! The proptest strategies that draw paths, offsets, sizes and operations, and the random-case driver.

use super::*;

pub(crate) static PATHS: [&str; 30] = [
    "a", "b", "c", "d1", "d2", // root
    "d1/a", "d1/b", "d1/c", "d1/d1", "d1/d2", //
    "d2/a", "d2/b", "d2/c", "d2/d1", "d2/d2", //
    "d1/d2/a", "d1/d2/b", "d1/d2/c", "d1/d2/d1", "d1/d2/d2", //
    "d2/d1/a", "d2/d1/b", "d2/d1/c", "d2/d1/d1", "d2/d1/d2", //
    "d1/d1/a", "d1/d1/b", "d1/d1/c", "d1/d1/d1", "d1/d1/d2",
];
// Path selectors, resolved against the model's tree when the op runs (see `Model::pick`).
pub(crate) static ANY_SEL: [&str; 6] = ["?a0", "?a1", "?a2", "?a3", "?a4", "?a5"];
pub(crate) static FILE_SEL: [&str; 6] = ["?f0", "?f1", "?f2", "?f3", "?f4", "?f5"];
pub(crate) static DIR_SEL: [&str; 4] = ["?D0", "?D1", "?D2", "?D3"];
pub(crate) static XATTR_SEL: [&str; 3] = ["?x0", "?x1", "?x2"];
pub(crate) static IN_DIR_SEL: [&str; 15] = [
    "?d0/a", "?d0/b", "?d0/c", "?d0/d1", "?d0/d2", //
    "?d1/a", "?d1/b", "?d1/c", "?d1/d1", "?d1/d2", //
    "?d2/a", "?d2/b", "?d2/c", "?d2/d1", "?d2/d2",
];
// Names of 255 (valid) and 256 (too long) bytes, in `split`'s shorthand.
pub(crate) static LONG_PATHS: [&str; 4] = ["#255", "#256", "d1/#255", "d1/#256"];
pub(crate) static MKNOD_KINDS: [NodeKind; 5] =
    [NodeKind::Regular, NodeKind::Fifo, NodeKind::Socket, NodeKind::CharDev, NodeKind::BlockDev];
pub(crate) static RDEVS: [u32; 3] = [0, 0x0103, 0x0800_0010];
pub(crate) static FILE_MODES: [u32; 6] = [0o644, 0o600, 0o755, 0o4755, 0o2755, 0o6711];
// What the kernel passes to mkdir (it strips setuid/setgid first).
pub(crate) static DIR_MODES: [u32; 4] = [0o755, 0o700, 0o777, 0o1777];
pub(crate) static CHMOD_MODES: [u32; 8] = [0o644, 0o000, 0o755, 0o4755, 0o2775, 0o2744, 0o1777, 0o7777];
pub(crate) static TARGETS: [&str; 4] = ["a", "../b", "d1/c", "/an/absolute/target/that/is/somewhat/long"];
pub(crate) static XNAMES: [&str; 7] = ["user.a", "user.a", "user.a", "user.b", "user.b", "trusted.t", "other.o"];
pub(crate) static XVALUES: [&str; 4] = ["", "v", "a longer value", "nul\0inside"];
pub(crate) static XFLAGS: [XFlags; 4] = [XFlags::Any, XFlags::Any, XFlags::CreateOnly, XFlags::ReplaceOnly];
pub(crate) static HOWS: [How; 4] = [How::Plain, How::NoReplace, How::Exchange, How::Whiteout];
pub(crate) static TIMES: [Timestamp; 5] = [
    Timestamp { secs: 0, nanos: 0 },
    Timestamp { secs: -1, nanos: 999_999_999 },
    Timestamp { secs: 1_700_000_000, nanos: 123_456_789 },
    Timestamp { secs: -5_000_000_000, nanos: 1 },
    Timestamp { secs: 253_402_300_799, nanos: 0 },
];

/// A path that may or may not exist: mostly near the root, or a name in an existing directory.
pub(crate) fn arb_new_path() -> BoxedStrategy<&'static str> {
    prop_oneof![
        4 => select(&PATHS[..10]),
        2 => select(&PATHS[..]),
        4 => select(&IN_DIR_SEL[..]),
        1 => select(&LONG_PATHS[..]),
    ]
    .boxed()
}

/// Mostly an existing entry of any kind.
pub(crate) fn arb_any_path() -> BoxedStrategy<&'static str> {
    prop_oneof![1 => arb_new_path(), 3 => select(&ANY_SEL[..])].boxed()
}

/// Mostly an existing regular file.
pub(crate) fn arb_file_path() -> BoxedStrategy<&'static str> {
    prop_oneof![1 => arb_new_path(), 4 => select(&FILE_SEL[..])].boxed()
}

/// Mostly an existing directory.
pub(crate) fn arb_dir_path() -> BoxedStrategy<&'static str> {
    prop_oneof![1 => arb_new_path(), 3 => select(&DIR_SEL[..])].boxed()
}

pub(crate) fn arb_read_offset() -> BoxedStrategy<u64> {
    prop_oneof![0u64..64, 4090u64..4110, 0u64..20_000, 65_530u64..65_560].boxed()
}

/// As [`arb_read_offset`], and rarely the largest offset (anything written there is EFBIG).
pub(crate) fn arb_offset() -> BoxedStrategy<u64> {
    prop_oneof![30 => arb_read_offset(), 1 => Just(tierfs::vfs::MAX_FILE_SIZE), 1 => Just(i64::MAX as u64)].boxed()
}

pub(crate) fn arb_len() -> BoxedStrategy<usize> {
    prop_oneof![10 => 1usize..64, 10 => 4090usize..4110, 10 => 1usize..6000, 1 => Just(0)].boxed()
}

pub(crate) fn arb_size() -> BoxedStrategy<u64> {
    prop_oneof![
        10 => 0u64..64,
        10 => 4090u64..4110,
        10 => 0u64..20_000,
        10 => 70_000u64..70_010,
        // Past the limit (the first of them killed the daemon of a store mount once).
        1 => prop_oneof![
            Just(999_999_999_999_999),
            Just(tierfs::vfs::MAX_FILE_SIZE + 1),
            Just(i64::MAX as u64 + 1),
            Just(u64::MAX)
        ],
    ]
    .boxed()
}

pub(crate) fn arb_falloc_len() -> BoxedStrategy<u64> {
    prop_oneof![1u64..64, 4090u64..4110, 1u64..20_000].boxed()
}

pub(crate) fn arb_op() -> impl Strategy<Value = Op> {
    let h = || 0usize..8;
    Union::new_weighted(vec![
        (
            8,
            (
                prop_oneof![3 => arb_new_path(), 1 => select(&FILE_SEL[..])],
                select(&FILE_MODES[..]),
                any::<bool>(),
                any::<bool>(),
                any::<bool>(),
            )
                .prop_map(|(at, mode, excl, trunc, keep_open)| Op::Create { at, mode, excl, trunc, keep_open })
                .boxed(),
        ),
        (5, (arb_new_path(), select(&DIR_MODES[..])).prop_map(|(at, mode)| Op::Mkdir { at, mode }).boxed()),
        (2, arb_any_path().prop_map(|at| Op::Unlink { at }).boxed()),
        (2, arb_dir_path().prop_map(|at| Op::Rmdir { at }).boxed()),
        (
            5,
            (arb_any_path(), prop_oneof![arb_new_path(), select(&ANY_SEL[..])], select(&HOWS[..]))
                .prop_map(|(from, to, how)| Op::Rename { from, to, how })
                .boxed(),
        ),
        (2, (arb_file_path(), arb_new_path()).prop_map(|(from, to)| Op::Link { from, to }).boxed()),
        (1, (arb_new_path(), select(&TARGETS[..])).prop_map(|(at, target)| Op::Symlink { at, target }).boxed()),
        (
            4,
            (arb_file_path(), arb_offset(), arb_len(), any::<u8>())
                .prop_map(|(at, offset, len, seed)| Op::Write { at, offset, len, seed })
                .boxed(),
        ),
        (2, (arb_file_path(), arb_size()).prop_map(|(at, size)| Op::Truncate { at, size }).boxed()),
        (1, (arb_any_path(), select(&CHMOD_MODES[..])).prop_map(|(at, mode)| Op::Chmod { at, mode }).boxed()),
        (
            1,
            (arb_any_path(), select(&TIMES[..]), select(&TIMES[..]))
                .prop_map(|(at, atime, mtime)| Op::Utimens { at, atime, mtime })
                .boxed(),
        ),
        (
            3,
            (
                prop_oneof![2 => arb_any_path(), 1 => select(&XATTR_SEL[..])],
                select(&XNAMES[..]),
                select(&XVALUES[..]),
                select(&XFLAGS[..]),
            )
                .prop_map(|(at, name, value, flags)| Op::SetXattr { at, name, value, flags })
                .boxed(),
        ),
        (
            2,
            (
                prop_oneof![1 => arb_any_path(), 2 => select(&XATTR_SEL[..])],
                prop_oneof![1 => select(&XNAMES[..]), 2 => Just("?")],
            )
                .prop_map(|(at, name)| Op::RemoveXattr { at, name })
                .boxed(),
        ),
        (
            2,
            (arb_file_path(), select(&FALLOCS[..]), arb_offset(), arb_falloc_len())
                .prop_map(|(at, mode, offset, len)| Op::Fallocate { at, mode, offset, len })
                .boxed(),
        ),
        (3, (arb_file_path(), any::<bool>()).prop_map(|(at, trunc)| Op::Open { at, trunc }).boxed()),
        (2, arb_file_path().prop_map(|at| Op::OpenUnlink { at }).boxed()),
        (
            2,
            (h(), arb_read_offset(), prop_oneof![1u32..64, 1u32..9000])
                .prop_map(|(h, offset, len)| Op::Read { h, offset, len })
                .boxed(),
        ),
        (
            2,
            (h(), arb_offset(), arb_len(), any::<u8>())
                .prop_map(|(h, offset, len, seed)| Op::WriteH { h, offset, len, seed })
                .boxed(),
        ),
        (1, (h(), arb_size()).prop_map(|(h, size)| Op::TruncateH { h, size }).boxed()),
        (
            1,
            (h(), select(&FALLOCS[..]), arb_offset(), arb_falloc_len())
                .prop_map(|(h, mode, offset, len)| Op::FallocateH { h, mode, offset, len })
                .boxed(),
        ),
        (
            1,
            (h(), arb_read_offset(), h(), arb_read_offset(), prop_oneof![1u64..64, 1u64..30_000])
                .prop_map(|(h_in, off_in, h_out, off_out, len)| Op::CopyH { h_in, off_in, h_out, off_out, len })
                .boxed(),
        ),
        (
            1,
            (h(), arb_read_offset(), any::<bool>()).prop_map(|(h, offset, hole)| Op::SeekH { h, offset, hole }).boxed(),
        ),
        (
            1,
            (arb_new_path(), select(&MKNOD_KINDS[..]), select(&FILE_MODES[..]), select(&RDEVS[..]))
                .prop_map(|(at, kind, perm, rdev)| Op::Mknod { at, kind, perm: perm & 0o777, rdev })
                .boxed(),
        ),
        (2, h().prop_map(|h| Op::Release { h }).boxed()),
        (1, any::<bool>().prop_map(|release_first| Op::Reopen { release_first }).boxed()),
    ])
}

/// Runs `cases` random sequences (unless PROPTEST_CASES says otherwise) on `tier`, and
/// panics with the shrunk failure.
pub(crate) fn run_random_cases(cases: u32, tier: Tier) {
    let mut config = Config::default();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = cases;
    }
    // Shrunk failures are kept as named tests below, not in a seed file.
    config.failure_persistence = None;
    let mut runner = TestRunner::new(config);
    let result =
        runner.run(&proptest::collection::vec(arb_op(), 1..=40), |ops| run_on(&ops, tier).map_err(TestCaseError::fail));
    match result {
        Ok(()) => {
            if std::env::var_os("MODEL_STATS").is_some() {
                for (op, [skip, ok, err]) in TALLY.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).iter() {
                    eprintln!("{op:12} ok {ok:6}  failed {err:6}  skipped {skip:6}");
                }
            }
        }
        Err(TestError::Fail(reason, _)) => panic!("{reason}"),
        Err(err) => panic!("{err}"),
    }
}
