//! The admin pages: accounts, API tokens and the audit log, kept in the database beside the fleet; a
//! change to an account or a token empties the gateway's token cache.

use super::{app_error, ConsoleService};
use crate::input::{NewToken, NewUser};
use crate::{accounts, audit};
use app::auth::{Caller, Role};
use app::error::AppError;
use app::views::{AccountsPage, AuditLine, AuditQuery, NewApiToken, TokenLimits};

impl ConsoleService {
    pub(super) async fn accounts_page(&self) -> Result<AccountsPage, AppError> {
        let pool = &self.pool;
        let accounts = accounts::users(pool).await.map_err(app_error)?;
        let tokens = accounts::tokens(pool).await.map_err(app_error)?;
        Ok(AccountsPage { accounts, tokens })
    }

    pub(super) async fn add_account(
        &self,
        actor: Caller,
        name: String,
        role: Role,
        password: String,
    ) -> Result<(), AppError> {
        let new = NewUser::parse(name, role, password).map_err(app_error)?;
        accounts::create_user(&self.pool, &new, &actor.name)
            .await
            .map(drop)
            .map_err(app_error)
    }

    pub(super) async fn remove_account(&self, actor: Caller, name: String) -> Result<(), AppError> {
        accounts::delete_user(&self.pool, &name, &actor.name)
            .await
            .map_err(app_error)?;
        self.tokens.forget();
        Ok(())
    }

    pub(super) async fn add_token(
        &self,
        actor: Caller,
        user: String,
        name: String,
        limits: TokenLimits,
    ) -> Result<NewApiToken, AppError> {
        let token = NewToken::parse(name, limits).map_err(app_error)?;
        accounts::create_token(&self.pool, &user, &token, &actor.name)
            .await
            .map_err(app_error)
    }

    pub(super) async fn remove_token(&self, actor: Caller, id: i64) -> Result<(), AppError> {
        accounts::revoke_token(&self.pool, id, &actor.name)
            .await
            .map_err(app_error)?;
        self.tokens.forget();
        Ok(())
    }

    pub(super) async fn audit_lines(&self, query: AuditQuery) -> Result<Vec<AuditLine>, AppError> {
        let text = |s: String| (!s.is_empty()).then_some(s);
        let filter = audit::AuditFilter {
            actor: text(query.actor),
            action: text(query.action),
            target: text(query.target),
            // One more than a page: whether there is an older page.
            limit: Some(app::views::AUDIT_PAGE as i64 + 1),
            before: query.before,
        };
        let entries = audit::entries(&self.pool, &filter)
            .await
            .map_err(app_error)?;
        Ok(entries
            .into_iter()
            .map(|e| AuditLine {
                id: e.id,
                at: e.at,
                actor: e.actor,
                action: e.action,
                target: e.target,
                changes: audit::changed_fields(e.before.as_ref(), e.after.as_ref()),
                before: e.before.map(|v| v.to_string()),
                after: e.after.map(|v| v.to_string()),
                revision: e.revision,
                restarts: e.restarts,
                client: e.client,
            })
            .collect())
    }
}
