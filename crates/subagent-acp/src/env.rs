//! The child's environment (spec §1.5): the parent's environment minus ambient credentials and
//! ambient `DSH_*` facts, then the configured `env` layered on top.

use std::collections::BTreeMap;
use std::ffi::OsString;

/// Whether an inherited variable is withheld from the child: its name contains `KEY`,
/// `PASSWORD`, `SECRET` or `TOKEN`, or starts with `DSH_` (all case-insensitive).
pub fn is_scrubbed(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    ["KEY", "PASSWORD", "SECRET", "TOKEN"]
        .iter()
        .any(|needle| upper.contains(needle))
        || upper.starts_with("DSH_")
}

/// The complete child environment: `inherited` minus [scrubbed](is_scrubbed) names, then
/// `explicit` merged on top (an explicit entry always reaches the child, even one the scrub would
/// have removed). The result is the whole environment: the spawn clears everything else.
pub fn child_environment<I>(inherited: I, explicit: &BTreeMap<String, String>) -> Vec<(OsString, OsString)>
where
    I: IntoIterator<Item = (OsString, OsString)>,
{
    let mut env: BTreeMap<OsString, OsString> = inherited
        .into_iter()
        .filter(|(name, _)| !is_scrubbed(&name.to_string_lossy()))
        .collect();
    for (name, value) in explicit {
        env.insert(OsString::from(name), OsString::from(value));
    }
    env.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lookup<'a>(env: &'a [(OsString, OsString)], name: &str) -> Option<&'a OsString> {
        env.iter().find(|(n, _)| n == name).map(|(_, v)| v)
    }

    /// spec: ACP-5 — an ambient `*_SECRET_TOKEN` is withheld while an explicit
    /// `DEEPSEEK_API_KEY` survives; `PATH`, `HOME`, locale and proxy variables pass.
    #[test]
    fn acp_5_scrub_then_layer() {
        let inherited = [
            ("MY_SECRET_TOKEN", "s"),
            ("db_password", "p"),
            ("OPENAI_API_KEY", "k"),
            ("dsh_permission_mode", "ask"),
            ("PATH", "/bin"),
            ("HOME", "/home/u"),
            ("LANG", "C.UTF-8"),
            ("HTTPS_PROXY", "http://proxy"),
        ]
        .map(|(n, v)| (OsString::from(n), OsString::from(v)));
        let explicit = BTreeMap::from([
            ("DEEPSEEK_API_KEY".to_owned(), "explicit".to_owned()),
            ("DSH_PERMISSION_MODE".to_owned(), "allow".to_owned()),
        ]);
        let env = child_environment(inherited, &explicit);
        for gone in [
            "MY_SECRET_TOKEN",
            "db_password",
            "OPENAI_API_KEY",
            "dsh_permission_mode",
        ] {
            assert_eq!(lookup(&env, gone), None, "{gone} must be scrubbed");
        }
        for kept in ["PATH", "HOME", "LANG", "HTTPS_PROXY"] {
            assert!(lookup(&env, kept).is_some(), "{kept} must survive");
        }
        assert_eq!(lookup(&env, "DEEPSEEK_API_KEY").unwrap(), "explicit");
        assert_eq!(lookup(&env, "DSH_PERMISSION_MODE").unwrap(), "allow");
    }
}
