//! What the seam deliberately does *not* offer (spec: CONT-85, CONT-86): no continuation verbs
//! beyond the specified ones on the service or the manager, no `steer` on a one-shot run, and no
//! `report` or `steer_subagent` tool registered by the seam.
//!
//! Method absence is checked at compile time: [`Absent`] gives *every* type zero-argument
//! methods with the forbidden names, returning [`Missing`]. Method resolution prefers an
//! inherent method (and a trait method of the type's own traits makes the call ambiguous), so
//! the calls below compile, and return [`Missing`], only while the type itself has no method of
//! that name: adding one (with any signature) breaks this module's build.

use super::*;
use crate::run::SubagentRun;

/// The marker every [`Absent`] method returns.
#[derive(Debug, PartialEq, Eq)]
struct Missing;

/// Zero-argument methods named after the verbs the seam must not have, for every type.
#[allow(dead_code)]
trait Absent {
    fn activation_state(&self) -> Missing {
        Missing
    }
    fn cancel(&self) -> Missing {
        Missing
    }
    fn kill(&self) -> Missing {
        Missing
    }
    fn report(&self) -> Missing {
        Missing
    }
    fn resume(&self) -> Missing {
        Missing
    }
    fn steer(&self) -> Missing {
        Missing
    }
    fn steer_continuable(&self) -> Missing {
        Missing
    }
    fn user_authority(&self) -> Missing {
        Missing
    }
}

impl<T: ?Sized> Absent for T {}

/// Asserts that every forbidden verb of the expression resolves to [`Absent`]'s. A macro, not a
/// generic function: inside a generic function only the bounds' methods are visible, so a type's
/// own method would go unnoticed.
macro_rules! assert_no_extra_verbs {
    ($target:expr) => {{
        let target = $target;
        assert_eq!(target.activation_state(), Missing);
        assert_eq!(target.cancel(), Missing);
        assert_eq!(target.kill(), Missing);
        assert_eq!(target.report(), Missing);
        assert_eq!(target.resume(), Missing);
        assert_eq!(target.steer(), Missing);
        assert_eq!(target.steer_continuable(), Missing);
        assert_eq!(target.user_authority(), Missing);
    }};
}

/// spec: CONT-85 — neither the service nor the continuation manager (together, the Rust seam's
/// "service") has `activationState`, `cancel`, `kill`, `report`, `resume`, `steer`,
/// `steerContinuable` or `userAuthority` (checked at compile time, see the module docs), and
/// the seam registers no `report` or `steer_subagent` tool: a host with the service, a
/// provider and the manager has neither tool, globally or for the parent.
#[tokio::test(start_paused = true)]
async fn cont_85_the_seam_has_no_extra_verbs_and_registers_no_control_tools() {
    let host = Host::new(by_session(2)).await;
    assert_no_extra_verbs!(&host.service);
    assert_no_extra_verbs!(&host.manager);
    let tools = &host.runtime.services().tools;
    for name in ["report", "steer_subagent"] {
        assert!(tools.get(name, None).is_none(), "a global `{name}` tool");
        assert!(
            tools.get(name, Some(host.parent.id())).is_none(),
            "a `{name}` tool for the parent"
        );
    }
    host.finish().await;
}

/// Zero-argument methods named after the drains, for every type: the service must have none
/// (the manager has them, which is why they are not in [`Absent`]).
#[allow(dead_code)]
trait AbsentDrains {
    fn dispose_all(&self) -> Missing {
        Missing
    }
    fn drain(&self) -> Missing {
        Missing
    }
    fn drain_continuable_children(&self) -> Missing {
        Missing
    }
    fn drain_continuable_descendants(&self) -> Missing {
        Missing
    }
}

impl<T: ?Sized> AbsentDrains for T {}

/// spec: SVC-5 (Rust equivalent) — the reference service exists without an agents service and
/// then has no manager-wide drain member while its public drains resolve to nothing. Here the
/// drains belong to the [`ContinuationManager`](super::ContinuationManager) alone, which cannot
/// be built without the host's `Services` (whose `agents` is not optional): the service has no
/// drain member at all — no manager-wide one, no public one (checked at compile time as in the
/// module docs) — so a host without a manager has nothing to drain and nothing to call.
#[tokio::test(start_paused = true)]
async fn svc_5_the_service_has_no_drain_members() {
    let host = Host::new(vec![]).await;
    let service = &host.service;
    assert_eq!(service.dispose_all(), Missing);
    assert_eq!(service.drain(), Missing);
    assert_eq!(service.drain_continuable_children(), Missing);
    assert_eq!(service.drain_continuable_descendants(), Missing);
    host.finish().await;
}

/// spec: CONT-86 — a one-shot run has no `steer` member: a [`SubagentRun`] (the trait object
/// every provider's start returns) offers none. Compile-time, see the module docs: with a
/// `steer` on the trait, the call below would be ambiguous and this module would not build.
#[test]
fn cont_86_a_one_shot_run_has_no_steer() {
    fn steer_of(run: &dyn SubagentRun) -> Missing {
        run.steer()
    }
    let steer: fn(&dyn SubagentRun) -> Missing = steer_of;
    let _ = steer;
}
