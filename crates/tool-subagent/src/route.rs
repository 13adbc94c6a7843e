//! Route resolution (`acp-and-tools.md` §3.5): which of the three execution routes one call
//! takes, from the instance's background settings and the model's `run_in_background`.

use crate::config::BackgroundMode;
use crate::model_text;

/// Where one call runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Route {
    /// Start, wait for the result, dispose.
    Foreground,
    /// A one-shot run owned by a background job.
    OneShotBackground,
    /// A continuable child (durable id, settlement notice).
    Continuable,
}

/// Resolves the route of one call.
///
/// | `enable_run_in_background` | mode | `run_in_background` | route |
/// |---|---|---|---|
/// | false | any | `true` | refused ([`model_text::BACKGROUND_DISABLED`]) |
/// | false | any | absent / false | foreground |
/// | true | one-shot | absent / false | foreground |
/// | true | one-shot | true | one-shot background (even over a continuable-capable provider) |
/// | true | continuable | absent / true | continuable |
/// | true | continuable | false | foreground |
pub fn resolve_route(
    enable_run_in_background: bool,
    mode: BackgroundMode,
    run_in_background: Option<bool>,
) -> Result<Route, &'static str> {
    if !enable_run_in_background {
        // The argument validator permits undeclared keys, so omitting the parameter from the
        // schema is not enough: a forced `true` is refused here.
        return match run_in_background {
            Some(true) => Err(model_text::BACKGROUND_DISABLED),
            _ => Ok(Route::Foreground),
        };
    }
    let continuable = mode == BackgroundMode::Continuable;
    let background = run_in_background.unwrap_or(continuable);
    Ok(match (background, continuable) {
        (false, _) => Route::Foreground,
        (true, false) => Route::OneShotBackground,
        (true, true) => Route::Continuable,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// spec: TOOL-5 — the whole route table of §3.5, including the refusal of a forced
    /// background call on a disabled instance and the foreground route it leaves open.
    #[test]
    fn route_table() {
        use BackgroundMode::{Continuable, OneShot};
        let cases = [
            (false, OneShot, Some(true), Err(model_text::BACKGROUND_DISABLED)),
            (
                false,
                Continuable,
                Some(true),
                Err(model_text::BACKGROUND_DISABLED),
            ),
            (false, OneShot, None, Ok(Route::Foreground)),
            (false, Continuable, Some(false), Ok(Route::Foreground)),
            (false, Continuable, None, Ok(Route::Foreground)),
            (true, OneShot, None, Ok(Route::Foreground)),
            (true, OneShot, Some(false), Ok(Route::Foreground)),
            (true, OneShot, Some(true), Ok(Route::OneShotBackground)),
            (true, Continuable, None, Ok(Route::Continuable)),
            (true, Continuable, Some(true), Ok(Route::Continuable)),
            (true, Continuable, Some(false), Ok(Route::Foreground)),
        ];
        for (enabled, mode, flag, expected) in cases {
            assert_eq!(
                resolve_route(enabled, mode, flag),
                expected,
                "{enabled} {mode:?} {flag:?}"
            );
        }
    }
}
