//! Completion notices: what the registry emits when a job settles unreported.

use agent::bus::Carried;
use agent::content::ContentBlock;
use agent::ids::SessionId;
use agent::message::{Message, MessageSource, PluginForm};

use super::model_text;
use super::registry::JobSnapshot;

/// An unreported job settled. Emitted once per job on [`JobRegistry::notices`]
/// (carrier = the owner), after the record is terminal and its waiters are released.
///
/// Delivery into the owner's conversation (inject into a busy owner's next step, or a follow-up
/// turn for an idle one) is the subscriber's business; [`JobNotice::to_message`] builds the
/// message.
///
/// [`JobRegistry::notices`]: super::JobRegistry::notices
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobNotice {
    /// The owning agent (the carrier).
    pub owner: SessionId,
    /// The settled job.
    pub job: JobSnapshot,
    /// The model-facing notice text
    /// (`background job <id> (<kind>: <label>) finished [status: …]. Read its output with job_output.`).
    pub text: String,
}

impl JobNotice {
    pub(crate) fn new(job: JobSnapshot) -> Self {
        let text = model_text::completion_notice(
            &job.id.0,
            &job.kind,
            &job.label,
            job.status,
            job.detail.as_deref(),
        );
        Self {
            owner: job.owner.clone(),
            job,
            text,
        }
    }

    /// The one-line summary (`<kind> <label> [status: …]`).
    pub fn summary(&self) -> String {
        model_text::notice_summary(
            &self.job.kind,
            &self.job.label,
            self.job.status,
            self.job.detail.as_deref(),
        )
    }

    /// The notice as a user-role plugin message (`plugin: tool-jobs`, form `notice`), with a
    /// fresh id.
    pub fn to_message(&self) -> Message {
        Message::user(
            vec![ContentBlock::text(self.text.clone())],
            MessageSource::Plugin {
                plugin: model_text::NOTICE_PLUGIN.to_owned(),
                form: Some(PluginForm::Notice {
                    summary: self.summary(),
                }),
            },
        )
    }
}

impl Carried for JobNotice {
    fn carrier(&self) -> Option<&SessionId> {
        Some(&self.owner)
    }
}
