//! `cargo xtask bench`: run the criterion benchmarks, then print each figure as a ratio to the
//! floor measured in the same run, against the target its issue sets.
//!
//! Criterion leaves one `estimates.json` per benchmark under `<target>/criterion/<id>/new/`. Only
//! estimates written by this run are read: a pair whose measurement or floor was not re-measured
//! (a filtered run, a benchmark that failed) is reported as such, never computed from a stale
//! file.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::SystemTime;

/// One figure and the floor it is divided by; both are criterion benchmark ids (the directory
/// names criterion gives them, `/` in a function name becoming `_`).
struct Ratio {
    what: &'static str,
    measured: &'static str,
    floor: &'static str,
    /// How many floors' worth of work the measured benchmark does (a fan-out of 4,000 children
    /// against one of 1,000 does 4): the ratio is `measured / (floor × floor_scale)`.
    floor_scale: f64,
    /// The issue's target, or `None` for a figure printed as context for another.
    target: Option<f64>,
    command: &'static str,
}

const RATIOS: &[Ratio] = &[
    Ratio {
        what: "one `spawn` one-shot: start → result → dispose",
        measured: "one_shot/spawn_start_result_dispose",
        floor: "one_shot/floor_tokio_spawn_join",
        floor_scale: 1.0,
        target: Some(10.0),
        command: "cargo bench -p subagent-spawn --bench spawn",
    },
    Ratio {
        what: "its reference-runtime share alone: create → one turn → dispose, no seam",
        measured: "one_shot/bare_runtime_create_turn_dispose",
        floor: "one_shot/floor_tokio_spawn_join",
        floor_scale: 1.0,
        target: None,
        command: "cargo bench -p subagent-spawn --bench spawn",
    },
    Ratio {
        what: "one idle → turn → idle cycle",
        measured: "turn_idle-turn-idle",
        floor: "floor_spawn-join",
        floor_scale: 1.0,
        target: Some(20.0),
        command: "cargo bench -p agent-loop --bench turn",
    },
    Ratio {
        what: "replay of a session-log corpus",
        measured: "replay/replay_jsonl",
        floor: "replay/floor_serde_value",
        floor_scale: 1.0,
        target: Some(3.0),
        command: "cargo bench -p invariants --bench replay",
    },
    Ratio {
        what: "fan-out scaling: the cost per child with 4,000 children alive at once, against 1,000",
        measured: "fan_out/4000_children",
        floor: "fan_out/1000_children",
        floor_scale: 4.0,
        target: None,
        command: "cargo bench -p subagent-spawn --bench fan_out",
    },
];

/// A throughput figure: `elements` per iteration of the benchmark.
struct Throughput {
    what: &'static str,
    id: &'static str,
    elements: f64,
    unit: &'static str,
}

const THROUGHPUTS: &[Throughput] = &[Throughput {
    what: "fan-out of 1,000 concurrent children",
    id: "fan_out/1000_children",
    elements: 1000.0,
    unit: "children/s",
}];

/// Runs `cargo bench --workspace` (or `cargo bench <args>` when arguments are given, e.g.
/// `-p subagent-spawn --bench spawn`), then prints the summary.
pub fn bench(cargo: &str, root: &Path, args: &[String]) -> Result<(), String> {
    let started = SystemTime::now();
    let mut cmd = Command::new(cargo);
    cmd.current_dir(root).arg("bench");
    if args.is_empty() {
        cmd.arg("--workspace");
    } else {
        cmd.args(args);
    }
    super::run(&mut cmd)?;
    let dir = criterion_dir(root);
    println!("\nratios to floors measured in this run ({}):", dir.display());
    for line in summary(&dir, started) {
        println!("  {line}");
    }
    Ok(())
}

/// Where criterion writes: `$CRITERION_HOME`, else `$CARGO_TARGET_DIR/criterion`, else the
/// workspace's `target/criterion`.
fn criterion_dir(root: &Path) -> PathBuf {
    if let Some(home) = std::env::var_os("CRITERION_HOME") {
        return PathBuf::from(home);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from);
    target.join("criterion")
}

/// One line per known figure: its ratio (or throughput), the target and the command to repeat
/// it, or why it cannot be given.
fn summary(dir: &Path, since: SystemTime) -> Vec<String> {
    let mut lines = Vec::new();
    for r in RATIOS {
        let line = match (mean_ns(dir, r.measured, since), mean_ns(dir, r.floor, since)) {
            (Ok(measured), Ok(floor)) => {
                let floor = floor * r.floor_scale;
                let ratio = measured / floor;
                let against = match r.target {
                    Some(target) => {
                        let verdict = if ratio <= target { "meets" } else { "MISSES" };
                        format!("{verdict} the ≤ {target}× target")
                    }
                    None => "no target of its own".to_owned(),
                };
                format!(
                    "{}: {} / {} = {ratio:.1}× the floor ({against}; `{}`)",
                    r.what,
                    human_ns(measured),
                    human_ns(floor),
                    r.command
                )
            }
            (Err(why), _) | (_, Err(why)) => format!("{}: not measured in this run ({why})", r.what),
        };
        lines.push(line);
    }
    for t in THROUGHPUTS {
        lines.push(match mean_ns(dir, t.id, since) {
            Ok(ns) => format!(
                "{}: {:.0} {} ({} per iteration)",
                t.what,
                t.elements * 1e9 / ns,
                t.unit,
                human_ns(ns)
            ),
            Err(why) => format!("{}: not measured in this run ({why})", t.what),
        });
    }
    lines
}

/// The mean time per iteration, in nanoseconds, of benchmark `id`, if this run wrote it.
fn mean_ns(dir: &Path, id: &str, since: SystemTime) -> Result<f64, String> {
    let path = dir.join(id).join("new").join("estimates.json");
    let meta = std::fs::metadata(&path).map_err(|_| format!("no estimates for `{id}`"))?;
    let written = meta
        .modified()
        .map_err(|e| format!("cannot read the time of {}: {e}", path.display()))?;
    if written < since {
        return Err(format!("the estimates for `{id}` are from an earlier run"));
    }
    let text = std::fs::read_to_string(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    parse_mean(&text).ok_or_else(|| format!("{} has no mean point estimate", path.display()))
}

/// `mean.point_estimate` of a criterion `estimates.json`, when it is a positive number.
fn parse_mean(text: &str) -> Option<f64> {
    let value: serde_json::Value = serde_json::from_str(text).ok()?;
    value["mean"]["point_estimate"].as_f64().filter(|ns| *ns > 0.0)
}

fn human_ns(ns: f64) -> String {
    if ns >= 1e6 {
        format!("{:.2} ms", ns / 1e6)
    } else if ns >= 1e3 {
        format!("{:.2} µs", ns / 1e3)
    } else {
        format!("{ns:.0} ns")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_estimate(dir: &Path, id: &str, mean: f64) {
        let at = dir.join(id).join("new");
        std::fs::create_dir_all(&at).unwrap();
        std::fs::write(
            at.join("estimates.json"),
            format!(r#"{{"mean":{{"point_estimate":{mean}}},"median":{{"point_estimate":1.0}}}}"#),
        )
        .unwrap();
    }

    #[test]
    fn ratios_come_from_this_runs_estimates() {
        let dir = tempfile::tempdir().unwrap();
        let since = SystemTime::now() - std::time::Duration::from_secs(1);
        write_estimate(dir.path(), "one_shot/spawn_start_result_dispose", 3000.0);
        write_estimate(dir.path(), "one_shot/floor_tokio_spawn_join", 300.0);
        write_estimate(dir.path(), "one_shot/bare_runtime_create_turn_dispose", 1500.0);
        write_estimate(dir.path(), "turn_idle-turn-idle", 9000.0);
        write_estimate(dir.path(), "floor_spawn-join", 300.0);
        write_estimate(dir.path(), "fan_out/1000_children", 25_000_000.0);
        write_estimate(dir.path(), "fan_out/4000_children", 150_000_000.0);
        let lines = summary(dir.path(), since);
        assert!(
            lines[0].contains("= 10.0× the floor (meets the ≤ 10× target"),
            "{}",
            lines[0]
        );
        assert!(
            lines[1].contains("= 5.0× the floor (no target of its own"),
            "{}",
            lines[1]
        );
        assert!(
            lines[2].contains("= 30.0× the floor (MISSES the ≤ 20× target"),
            "{}",
            lines[2]
        );
        assert!(
            lines[3].contains("not measured in this run (no estimates for `replay/replay_jsonl`)"),
            "{}",
            lines[3]
        );
        // 4,000 children at 150 ms against 1,000 at 25 ms: 1.5× the cost per child.
        assert!(
            lines[4].contains("150.00 ms / 100.00 ms = 1.5× the floor (no target of its own"),
            "{}",
            lines[4]
        );
        assert!(lines[5].contains("40000 children/s"), "{}", lines[5]);
    }

    #[test]
    fn estimates_older_than_the_run_are_not_used() {
        let dir = tempfile::tempdir().unwrap();
        write_estimate(dir.path(), "one_shot/spawn_start_result_dispose", 3000.0);
        write_estimate(dir.path(), "one_shot/floor_tokio_spawn_join", 300.0);
        let later = SystemTime::now() + std::time::Duration::from_secs(60);
        let lines = summary(dir.path(), later);
        assert!(lines[0].contains("are from an earlier run"), "{}", lines[0]);
    }

    #[test]
    fn a_malformed_or_non_positive_estimate_is_refused() {
        assert_eq!(parse_mean("not json"), None);
        assert_eq!(parse_mean(r#"{"mean":{"point_estimate":0}}"#), None);
        assert_eq!(parse_mean(r#"{"mean":{}}"#), None);
        assert_eq!(parse_mean(r#"{"mean":{"point_estimate":2.5}}"#), Some(2.5));
    }
}
