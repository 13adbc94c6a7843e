//! Prompt assembly (spec §12): the [`PromptRegistry`] behind [`agent::prompt::Prompt`], strict
//! persona interpolation, system-text rendering and runtime-context snapshots.
//!
//! * **Sections** are concatenated by ascending `order`, ties by registration order, empty
//!   sections dropped, joined by a blank line ([`render_system`]). A scoped section shadows the
//!   global section of the same name for its agent only.
//! * **Persona**: the section named [`PERSONA_SECTION`] (global or scoped) is a template whose
//!   complete `{{name}}` groups are interpolated strictly against [`PromptVariables`] (`model`,
//!   `cwd`, `provider`): a malformed group, an unknown name or a variable without a value is a
//!   [`PromptError`]. A lone `{{` with no later `}}` is literal prose; substituted values are not
//!   scanned again. Other sections are used verbatim.
//! * **Runtime contexts** render, in order, into one snapshot ([`render_contexts`]); the driver
//!   turns a changed snapshot into a `user/message` with source `plugin` named
//!   [`PROMPT_PLUGIN`] and form `snapshot` ([`snapshot_message`]).
//!
//! * **Tool guidance**: a section bound to a tool ([`PromptSection::tool`]) is part of an
//!   agent's sections only while that agent sees the tool in the tool registry the prompt
//!   registry is linked to ([`PromptRegistry::link_tools`]; the runtime builder links its own).
//!
//! # Locking
//! One mutex protects the registry's entry lists and the tool link. It is held only to push,
//! remove or copy entries; context renderers and tool-visibility lookups run after it is
//! released.

pub mod model_text;

use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use agent::message::SnapshotSection;
use agent::prompt::{PERSONA_SECTION, PROMPT_PLUGIN, Prompt, PromptSection, RuntimeContext};
use agent::registration::Unregister;
use agent::scoped::ScopedEntries;
use agent::tools::Tools;
use agent::{ContentBlock, Message, MessageSource, PluginForm, Registration, SessionId};

/// The registrations, global or per agent ([`ScopedEntries`]: an agent's resolution and removal
/// do not depend on how many other agents are registered).
#[derive(Default)]
struct State {
    sections: ScopedEntries<PromptSection>,
    contexts: ScopedEntries<RuntimeContext>,
    /// The tool registry deciding the visibility of tool-bound sections (weak: the tools'
    /// handlers may hold the host's services, and so this registry).
    tools: Option<Weak<dyn Tools>>,
}

/// Which entries a registration guard removes from (the low bit of the guard's key).
#[derive(Clone, Copy)]
enum Kind {
    Section = 0,
    Context = 1,
}

/// The registry's state behind its lock; registration guards remove their entry from it by key
/// ([`Registration::keyed`]: no closure to allocate per registration).
#[derive(Default)]
struct Shared(Mutex<State>);

impl std::ops::Deref for Shared {
    type Target = Mutex<State>;

    fn deref(&self) -> &Mutex<State> {
        &self.0
    }
}

impl Unregister for Shared {
    fn unregister(&self, scope: Option<SessionId>, key: u64) {
        let id = key >> 1;
        // Dropped after the lock is released.
        let removed = {
            let mut state = self.lock();
            if key & 1 == Kind::Section as u64 {
                (state.sections.remove(scope.as_ref(), id), None)
            } else {
                (None, state.contexts.remove(scope.as_ref(), id))
            }
        };
        drop(removed);
    }
}

/// The layered prompt registry: global and per-agent sections and runtime contexts.
///
/// Cheap to clone (shared). Registration guards hold the registry weakly. Within one layer a
/// later registration of the same name shadows an earlier one until it is removed (the
/// [`Prompt`] contract has no error path); across layers the agent's own entry shadows the
/// global one.
#[derive(Clone, Default)]
pub struct PromptRegistry {
    state: Arc<Shared>,
}

impl std::fmt::Debug for PromptRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.state.lock();
        f.debug_struct("PromptRegistry")
            .field("sections", &state.sections.len())
            .field("contexts", &state.contexts.len())
            .finish()
    }
}

/// Resolves one layered view: per name, the agent's own entry (latest registration) over the
/// global one (latest registration); then sorted by `(order, registration)`.
fn resolve<T: Clone>(
    entries: &ScopedEntries<T>,
    agent: Option<&SessionId>,
    name: impl Fn(&T) -> &str,
    order: impl Fn(&T) -> i32,
) -> Vec<T> {
    let (global, own) = (entries.global(), entries.own(agent));
    // Nothing or a single entry to show (the common cases) needs no choosing.
    match (global, own) {
        ([], []) => return Vec::new(),
        ([(_, only)], []) | ([], [(_, only)]) => return vec![only.clone()],
        _ => {}
    }
    // The global layer first, then the agent's own: a later entry of the same name replaces
    // the chosen one, so the latest global entry is replaced by any own entry, and the latest
    // own entry wins.
    let mut chosen: Vec<&(u64, T)> = Vec::new();
    for entry in global.iter().chain(own) {
        match chosen.iter().position(|(_, c)| name(c) == name(&entry.1)) {
            Some(i) => chosen[i] = entry,
            None => chosen.push(entry),
        }
    }
    chosen.sort_by_key(|(id, item)| (order(item), *id));
    chosen.into_iter().map(|(_, item)| item.clone()).collect()
}

impl PromptRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Links the tool registry that decides which agents see a tool-bound section
    /// ([`PromptSection::tool`]): such a section is part of `sections(agent)` only when
    /// `tools.get(tool, agent)` finds the tool. Until a registry is linked (or once it is
    /// dropped), tool-bound sections are left out. A later link replaces an earlier one.
    pub fn link_tools(&self, tools: &Arc<dyn Tools>) {
        self.state.lock().tools = Some(Arc::downgrade(tools));
    }

    /// The number of live registrations (sections and contexts, all layers).
    pub fn len(&self) -> usize {
        let state = self.state.lock();
        state.sections.len() + state.contexts.len()
    }

    /// The number of agent-scoped registrations (all agents).
    pub fn scoped_len(&self) -> usize {
        let state = self.state.lock();
        state.sections.scoped_len() + state.contexts.scoped_len()
    }

    /// Whether nothing is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The guard removing registration `id` from `scope`'s layer of the `kind` entries.
    fn guard(&self, kind: Kind, scope: Option<&SessionId>, id: u64) -> Registration {
        let weak: Weak<dyn Unregister> = Arc::downgrade(&self.state) as _;
        Registration::keyed(weak, scope.cloned(), (id << 1) | kind as u64)
    }
}

impl Prompt for PromptRegistry {
    fn section(&self, scope: Option<&SessionId>, section: PromptSection) -> Registration {
        let id = self.state.lock().sections.push(scope, section);
        self.guard(Kind::Section, scope, id)
    }

    fn runtime_context(&self, scope: Option<&SessionId>, context: RuntimeContext) -> Registration {
        let id = self.state.lock().contexts.push(scope, context);
        self.guard(Kind::Context, scope, id)
    }

    fn sections(&self, agent: Option<&SessionId>) -> Vec<PromptSection> {
        let (mut sections, tools) = {
            let state = self.state.lock();
            let sections = resolve(&state.sections, agent, |s| &s.name, |s| s.order);
            // The link is read only when a section needs it (this runs at every pre-step).
            let tools = if sections.iter().any(|s| s.tool.is_some()) {
                state.tools.as_ref().and_then(Weak::upgrade)
            } else {
                None
            };
            (sections, tools)
        };
        // Tool visibility is looked up after releasing the lock.
        if sections.iter().any(|s| s.tool.is_some()) {
            sections.retain(|section| match &section.tool {
                None => true,
                Some(tool) => tools
                    .as_ref()
                    .is_some_and(|tools| tools.get(tool, agent).is_some()),
            });
        }
        sections
    }

    fn runtime_contexts(&self, agent: Option<&SessionId>) -> Vec<RuntimeContext> {
        let state = self.state.lock();
        resolve(&state.contexts, agent, |c| &c.name, |c| c.order)
    }
}

/// The variables a persona template may reference. Every name is registered; a `None` value
/// makes a reference to it an error.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PromptVariables {
    /// The agent's model route (`AgentOptions.model`).
    pub model: Option<String>,
    /// The session's working directory (`header.cwd`).
    pub cwd: Option<String>,
    /// The agent's provider route (`AgentOptions.provider`).
    pub provider: Option<String>,
}

impl PromptVariables {
    const NAMES: [&'static str; 3] = ["model", "cwd", "provider"];

    fn get(&self, name: &str) -> Option<Option<&str>> {
        match name {
            "model" => Some(self.model.as_deref()),
            "cwd" => Some(self.cwd.as_deref()),
            "provider" => Some(self.provider.as_deref()),
            _ => None,
        }
    }
}

/// A persona template failed strict interpolation. The message names the section.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PromptError {
    /// A `{{…}}` group that is not a simple `{{name}}` reference.
    #[error(
        "malformed prompt variable reference \"{reference}\" in section \"{section}\" (references are complete {{{{name}}}} groups with names matching [a-z][a-z0-9_]*)"
    )]
    Malformed {
        /// The offending text.
        reference: String,
        /// The section.
        section: String,
    },
    /// A reference to a name that is not a registered variable.
    #[error(
        "unknown prompt variable \"{{{{{name}}}}}\" in section \"{section}\"; registered variables: {known}"
    )]
    Unknown {
        /// The name.
        name: String,
        /// The section.
        section: String,
        /// The registered names, comma-separated.
        known: String,
    },
    /// A reference to a registered variable that has no value for this agent.
    #[error("prompt variable \"{{{{{name}}}}}\" has no value for this assembly (section \"{section}\")")]
    NoValue {
        /// The name.
        name: String,
        /// The section.
        section: String,
    },
}

fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some('a'..='z')) && chars.all(|c| matches!(c, 'a'..='z' | '0'..='9' | '_'))
}

/// Interpolates the complete `{{name}}` groups of `text` strictly against `vars`. `section`
/// names the input in errors.
pub fn interpolate(text: &str, vars: &PromptVariables, section: &str) -> Result<String, PromptError> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(open) = rest.find("{{") {
        let after = &rest[open + 2..];
        // A complete group is `{{` + no braces + `}}`.
        let group_end = after.find(['{', '}']).filter(|&i| after[i..].starts_with("}}"));
        match group_end {
            Some(end) => {
                let name = &after[..end];
                if !valid_name(name) {
                    return Err(PromptError::Malformed {
                        reference: format!("{{{{{name}}}}}"),
                        section: section.to_owned(),
                    });
                }
                let value = vars.get(name).ok_or_else(|| PromptError::Unknown {
                    name: name.to_owned(),
                    section: section.to_owned(),
                    known: PromptVariables::NAMES.join(", "),
                })?;
                let value = value.ok_or_else(|| PromptError::NoValue {
                    name: name.to_owned(),
                    section: section.to_owned(),
                })?;
                out.push_str(&rest[..open]);
                out.push_str(value);
                rest = &after[end + 2..];
            }
            None if after.contains("}}") => {
                let snippet: String = rest[open..].chars().take(16).collect();
                return Err(PromptError::Malformed {
                    reference: snippet,
                    section: section.to_owned(),
                });
            }
            None => {
                out.push_str(&rest[..open + 2]);
                rest = after;
            }
        }
    }
    out.push_str(rest);
    Ok(out)
}

/// Renders the system text: sections in the given (already sorted) order, the persona section
/// interpolated, empty texts dropped, joined by a blank line. `None` when nothing remains.
pub fn render_system(
    sections: &[PromptSection],
    vars: &PromptVariables,
) -> Result<Option<String>, PromptError> {
    render_sections(sections, |section| {
        interpolate(&section.text, vars, &section.name)
    })
}

/// [`render_system`] with the persona interpolation supplied by `persona` (called only for a
/// persona section, so the variables can be built lazily).
pub(crate) fn render_sections(
    sections: &[PromptSection],
    mut persona: impl FnMut(&PromptSection) -> Result<String, PromptError>,
) -> Result<Option<String>, PromptError> {
    let mut out: Option<String> = None;
    for section in sections {
        let interpolated;
        let text: &str = if section.name == PERSONA_SECTION {
            interpolated = persona(section)?;
            &interpolated
        } else {
            &section.text
        };
        if text.is_empty() {
            continue;
        }
        match &mut out {
            None => out = Some(text.to_owned()),
            Some(joined) => {
                joined.push_str("\n\n");
                joined.push_str(text);
            }
        }
    }
    Ok(out)
}

/// Renders the runtime contexts `agent` sees (already sorted) into snapshot sections; contexts
/// that render to nothing or to empty text contribute nothing.
///
/// The contexts are consumed (as [`Prompt::runtime_contexts`] returns them, once per pre-step):
/// each section takes its context's name, and the sections reuse the contexts' list.
pub fn render_contexts(contexts: Vec<RuntimeContext>, agent: &SessionId) -> Vec<SnapshotSection> {
    if contexts.is_empty() {
        // No context (an agent nothing is delegated to): skip the in-place machinery.
        return Vec::new();
    }
    contexts
        .into_iter()
        .filter_map(|c| {
            let text = (c.render)(agent)?;
            (!text.is_empty()).then_some(SnapshotSection { name: c.name, text })
        })
        .collect()
}

/// The blank line between the snapshot header and each rendered section.
const SNAPSHOT_SEP: &str = "\n\n";

/// The snapshot text for rendered sections: the header plus the texts joined by blank lines, or
/// the empty string when there is none.
pub fn snapshot_body(sections: &[SnapshotSection]) -> String {
    if sections.is_empty() {
        return String::new();
    }
    let mut text = String::with_capacity(snapshot_body_len(sections));
    text.push_str(model_text::SNAPSHOT_HEADER);
    for section in sections {
        text.push_str(SNAPSHOT_SEP);
        text.push_str(&section.text);
    }
    text
}

/// The length of [`snapshot_body`] for non-empty `sections`.
fn snapshot_body_len(sections: &[SnapshotSection]) -> usize {
    model_text::SNAPSHOT_HEADER.len()
        + sections
            .iter()
            .map(|s| SNAPSHOT_SEP.len() + s.text.len())
            .sum::<usize>()
}

/// Whether `text` equals [`snapshot_body`] of the non-empty `sections`, compared piece by piece
/// so that an unchanged snapshot (every later step of a turn) builds no text.
fn is_snapshot_body(text: &str, sections: &[SnapshotSection]) -> bool {
    if text.len() != snapshot_body_len(sections) {
        return false;
    }
    let Some(mut rest) = text.strip_prefix(model_text::SNAPSHOT_HEADER) else {
        return false;
    };
    for section in sections {
        match rest
            .strip_prefix(SNAPSHOT_SEP)
            .and_then(|r| r.strip_prefix(section.text.as_str()))
        {
            Some(r) => rest = r,
            None => return false,
        }
    }
    // The lengths matched, so every byte was compared.
    rest.is_empty()
}

/// What the log says about the last snapshot the model saw.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum RetainedSnapshot {
    /// No snapshot message was ever written.
    #[default]
    Never,
    /// The text of the last snapshot message (`None` when it was not a single text block).
    Last(Option<String>),
}

/// Whether `message` is a runtime-context snapshot written by the prompt service.
pub fn is_snapshot_message(message: &Message) -> bool {
    matches!(&message.source, MessageSource::Plugin { plugin, .. } if plugin == PROMPT_PLUGIN)
}

/// The text a retained snapshot message carries, when it is one text block.
pub fn snapshot_message_text(message: &Message) -> Option<String> {
    match message.content.as_slice() {
        [ContentBlock::Text { text }] => Some(text.clone()),
        _ => None,
    }
}

/// The snapshot message to enter, if the current contexts differ from what the model last saw:
/// `None` when nothing ever was and nothing is active, or when the text is unchanged. With no
/// active context after an earlier snapshot, the message is the cleared notice (no form).
pub fn snapshot_message(current: &[SnapshotSection], retained: &RetainedSnapshot) -> Option<Message> {
    let text = changed_snapshot_text(current, retained)?;
    Some(snapshot_message_from(current.to_vec(), text))
}

/// The text of the snapshot message [`snapshot_message`] would enter, if any.
///
/// The retained text is compared with the current contexts before any text is built: only a
/// changed snapshot allocates its text.
pub(crate) fn changed_snapshot_text(
    current: &[SnapshotSection],
    retained: &RetainedSnapshot,
) -> Option<String> {
    match retained {
        RetainedSnapshot::Never if current.is_empty() => return None,
        RetainedSnapshot::Last(Some(last)) => {
            let unchanged = if current.is_empty() {
                last == model_text::SNAPSHOT_CLEARED
            } else {
                is_snapshot_body(last, current)
            };
            if unchanged {
                return None;
            }
        }
        _ => {}
    }
    Some(if current.is_empty() {
        model_text::SNAPSHOT_CLEARED.to_owned()
    } else {
        snapshot_body(current)
    })
}

/// The snapshot message with `text` (from [`changed_snapshot_text`]) for `current`.
pub(crate) fn snapshot_message_from(current: Vec<SnapshotSection>, text: String) -> Message {
    let form = (!current.is_empty()).then_some(PluginForm::Snapshot { sections: current });
    Message::user(
        vec![ContentBlock::text(text)],
        MessageSource::Plugin {
            plugin: PROMPT_PLUGIN.to_owned(),
            form,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars() -> PromptVariables {
        PromptVariables {
            model: Some("m1".into()),
            cwd: None,
            provider: Some("p".into()),
        }
    }

    #[test]
    fn interpolation_is_strict() {
        assert_eq!(
            interpolate("on {{model}} via {{provider}}", &vars(), "s").unwrap(),
            "on m1 via p"
        );
        assert_eq!(interpolate("a {{ lone", &vars(), "s").unwrap(), "a {{ lone");
        let err = interpolate("in {{cwd}}", &vars(), "deployment:persona").unwrap_err();
        assert_eq!(
            err.to_string(),
            "prompt variable \"{{cwd}}\" has no value for this assembly (section \"deployment:persona\")"
        );
        let err = interpolate("{{nope}}", &vars(), "s").unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown prompt variable \"{{nope}}\" in section \"s\"; registered variables: model, cwd, provider"
        );
        assert!(matches!(
            interpolate("{{Bad}}", &vars(), "s").unwrap_err(),
            PromptError::Malformed { .. }
        ));
        assert!(matches!(
            interpolate("{{a{b}} x}}", &vars(), "s").unwrap_err(),
            PromptError::Malformed { .. }
        ));
        // Substituted values are not scanned again.
        let v = PromptVariables {
            model: Some("{{cwd}}".into()),
            ..vars()
        };
        assert_eq!(interpolate("{{model}}", &v, "s").unwrap(), "{{cwd}}");
    }

    #[test]
    fn scoped_sections_shadow_global_ones_and_sort_by_order() {
        let reg = PromptRegistry::new();
        let sec = |name: &str, order, text: &str| PromptSection {
            name: name.into(),
            order,
            text: text.into(),
            tool: None,
        };
        let a: SessionId = "a".into();
        let _g1 = reg.section(None, sec(PERSONA_SECTION, 0, "global {{model}}"));
        let _g2 = reg.section(None, sec("tools", 100, "use tools"));
        let _g3 = reg.section(None, sec("id", -100, "identity"));
        let scoped = reg.section(Some(&a), sec(PERSONA_SECTION, 0, "child"));
        let render = |agent: Option<&SessionId>| render_system(&reg.sections(agent), &vars()).unwrap();
        assert_eq!(render(Some(&a)).unwrap(), "identity\n\nchild\n\nuse tools");
        assert_eq!(render(None).unwrap(), "identity\n\nglobal m1\n\nuse tools");
        assert_eq!(
            render(Some(&"b".into())).unwrap(),
            "identity\n\nglobal m1\n\nuse tools"
        );
        drop(scoped);
        assert_eq!(render(Some(&a)).unwrap(), "identity\n\nglobal m1\n\nuse tools");
        assert_eq!(reg.len(), 3);
    }

    /// A tool body that is never called.
    struct Idle;

    #[async_trait::async_trait]
    impl agent::tools::ToolHandler for Idle {
        async fn execute(
            &self,
            _arguments: serde_json::Value,
            _ctx: agent::tools::ToolContext,
        ) -> Result<agent::tools::ToolOutput, agent::tools::ToolError> {
            Ok(agent::tools::ToolOutput::text("idle"))
        }
    }

    /// A section bound to a tool is part of an agent's sections only while that agent sees the
    /// tool in the linked registry: absent before a registry is linked, before the tool is
    /// registered, where a restriction hides it, and after the registry is dropped.
    #[test]
    fn tool_bound_sections_follow_the_tools_visibility() {
        let reg = PromptRegistry::new();
        let (open, denied): (SessionId, SessionId) = ("open".into(), "denied".into());
        let section = |name: &str, tool: Option<&str>| PromptSection {
            name: name.into(),
            order: 100,
            text: format!("about {name}"),
            tool: tool.map(str::to_owned),
        };
        let _plain = reg.section(None, section("plain", None));
        let _bound = reg.section(None, section("tool:probe", Some("probe")));
        let names = |agent: Option<&SessionId>| -> Vec<String> {
            reg.sections(agent).into_iter().map(|s| s.name).collect()
        };
        assert_eq!(names(Some(&open)), ["plain"], "no tool registry linked yet");

        let probe = || agent::tools::ToolDefinition {
            name: "probe".into(),
            description: "probe".into(),
            parameters: serde_json::json!({"type": "object"}),
            concurrency_safe: true,
            handler: Arc::new(Idle),
        };
        let registry = crate::tools::ToolRegistry::new();
        let tools: Arc<dyn agent::Tools> = Arc::new(registry.clone());
        reg.link_tools(&tools);
        assert_eq!(names(Some(&open)), ["plain"], "the tool is not registered yet");
        let tool = tools.register(None, probe()).unwrap();
        let restriction = tools
            .restrict(
                Some(&denied),
                agent::tools::ToolRestriction {
                    allow: None,
                    deny: Some(vec!["probe".into()]),
                },
            )
            .unwrap();
        assert_eq!(names(Some(&open)), ["plain", "tool:probe"]);
        assert_eq!(names(None), ["plain", "tool:probe"]);
        assert_eq!(names(Some(&denied)), ["plain"]);
        drop(restriction);
        assert_eq!(names(Some(&denied)), ["plain", "tool:probe"]);
        drop(tool);
        assert_eq!(names(Some(&open)), ["plain"]);
        let _again = registry.register(None, probe()).unwrap();
        assert_eq!(names(Some(&open)), ["plain", "tool:probe"]);
        // The tool is still registered (`registry` shares its state), but the linked handle is
        // gone: the prompt registry cannot tell, so the section is left out.
        drop(tools);
        assert_eq!(names(Some(&open)), ["plain"], "the linked registry is gone");
    }

    /// The piecewise comparison of an unchanged snapshot answers exactly as comparing the built
    /// text would, including texts that straddle section boundaries or differ in length.
    #[test]
    fn unchanged_snapshots_are_detected_without_building_the_text() {
        let sections = |texts: &[&str]| -> Vec<SnapshotSection> {
            texts
                .iter()
                .enumerate()
                .map(|(i, text)| SnapshotSection {
                    name: format!("c{i}"),
                    text: (*text).to_owned(),
                })
                .collect()
        };
        // What `changed_snapshot_text` answered when it built the text before comparing.
        let reference = |current: &[SnapshotSection], retained: &RetainedSnapshot| {
            if current.is_empty() && *retained == RetainedSnapshot::Never {
                return None;
            }
            let text = if current.is_empty() {
                model_text::SNAPSHOT_CLEARED.to_owned()
            } else {
                snapshot_body(current)
            };
            match retained {
                RetainedSnapshot::Last(Some(last)) if *last == text => None,
                _ => Some(text),
            }
        };
        let currents = [
            sections(&[]),
            sections(&["a"]),
            sections(&["a", "b"]),
            sections(&["a\n\nb"]),
            sections(&["a", "b", ""]),
            sections(&["ab"]),
            sections(&["a", "bc"]),
        ];
        let mut retained = vec![
            RetainedSnapshot::Never,
            RetainedSnapshot::Last(None),
            RetainedSnapshot::Last(Some(String::new())),
            RetainedSnapshot::Last(Some(model_text::SNAPSHOT_CLEARED.into())),
            RetainedSnapshot::Last(Some(model_text::SNAPSHOT_HEADER.into())),
            RetainedSnapshot::Last(Some(format!("{}\n\n", model_text::SNAPSHOT_HEADER))),
            RetainedSnapshot::Last(Some(format!("{}\n\nb\n\na", model_text::SNAPSHOT_HEADER))),
            RetainedSnapshot::Last(Some(format!("x{}", &model_text::snapshot_text("a")[1..]))),
        ];
        retained.extend(
            currents
                .iter()
                .map(|c| RetainedSnapshot::Last(Some(snapshot_body(c)))),
        );
        for current in &currents {
            for last in &retained {
                assert_eq!(
                    changed_snapshot_text(current, last),
                    reference(current, last),
                    "{current:?} after {last:?}"
                );
            }
        }
        // The same contexts again write nothing; `["a", "b"]` and `["a\n\nb"]` render alike.
        let shown = RetainedSnapshot::Last(Some(snapshot_body(&currents[2])));
        assert_eq!(changed_snapshot_text(&currents[2], &shown), None);
        assert_eq!(changed_snapshot_text(&currents[3], &shown), None);
        assert!(changed_snapshot_text(&currents[4], &shown).is_some());
    }

    #[test]
    fn snapshots_are_written_only_when_changed() {
        let a: SessionId = "a".into();
        let reg = PromptRegistry::new();
        assert_eq!(snapshot_message(&[], &RetainedSnapshot::Never), None);
        let guard = reg.runtime_context(None, RuntimeContext::fixed("policy", 110, "Mode: read-only."));
        let current = render_contexts(reg.runtime_contexts(Some(&a)), &a);
        let msg = snapshot_message(&current, &RetainedSnapshot::Never).unwrap();
        assert!(is_snapshot_message(&msg));
        let text = snapshot_message_text(&msg).unwrap();
        assert_eq!(text, model_text::snapshot_text("Mode: read-only."));
        assert_eq!(
            snapshot_message(&current, &RetainedSnapshot::Last(Some(text.clone()))),
            None
        );
        drop(guard);
        let cleared = snapshot_message(&[], &RetainedSnapshot::Last(Some(text))).unwrap();
        assert_eq!(cleared.text(), model_text::SNAPSHOT_CLEARED);
        assert_eq!(
            cleared.source,
            MessageSource::Plugin {
                plugin: PROMPT_PLUGIN.into(),
                form: None
            }
        );
        assert_eq!(
            snapshot_message(
                &[],
                &RetainedSnapshot::Last(Some(model_text::SNAPSHOT_CLEARED.into()))
            ),
            None
        );
    }
}
