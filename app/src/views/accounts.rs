//! The admin page: accounts and API tokens, with what each token may call (its secret shown once, when
//! made).

use serde::{Deserialize, Serialize};

/// An account, as the admin page lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Account {
    /// Its name.
    pub name: String,
    /// Its role.
    pub role: crate::auth::Role,
    /// When it was made.
    pub created_at: String,
}

/// An API token, as the admin page lists it (never its secret).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiToken {
    /// Its id.
    pub id: i64,
    /// What it is for.
    pub name: String,
    /// Whose role it acts with.
    pub user: String,
    /// Its first characters.
    pub prefix: String,
    /// When it was made.
    pub created_at: String,
    /// When it was last used.
    pub last_used_at: Option<String>,
    /// When it was revoked.
    pub revoked_at: Option<String>,
    /// What it may call, and until when.
    #[serde(flatten)]
    pub limits: TokenLimits,
}

/// What an API token may call: the whole API with its owner's role, or only the gateway (`/v1`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TokenScope {
    /// Every route its owner's role allows, the gateway included.
    #[default]
    Api,
    /// Only the gateway: `/v1`, for the models it names.
    Inference,
}

impl TokenScope {
    /// Its name in the API and the database.
    pub fn as_str(self) -> &'static str {
        match self {
            TokenScope::Api => "api",
            TokenScope::Inference => "inference",
        }
    }
}

/// How an API token is limited beside its owner's role.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenLimits {
    /// `api` (the default) or `inference`.
    #[serde(default)]
    pub scope: TokenScope,
    /// For an inference token, the models it may call; every model when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub models: Option<Vec<String>>,
    /// When it stops working, RFC 3339 (`2027-01-31T00:00:00Z`); never when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
}

impl TokenLimits {
    /// What the token list says of them: `API`, `inference: a, b`, with `until …`.
    pub fn describe(&self) -> String {
        let what = match (&self.scope, &self.models) {
            (TokenScope::Api, _) => "API".to_owned(),
            (TokenScope::Inference, None) => "inference, every model".to_owned(),
            (TokenScope::Inference, Some(models)) => format!("inference: {}", models.join(", ")),
        };
        match &self.expires_at {
            Some(at) => format!("{what}, until {at}"),
            None => what,
        }
    }
}

/// A token just made, with its secret: shown this once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewApiToken {
    /// The token.
    pub token: ApiToken,
    /// The secret to send as `Authorization: Bearer …`.
    pub secret: String,
}

/// The accounts and API tokens, for the admin page.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccountsPage {
    /// Every account.
    pub accounts: Vec<Account>,
    /// Every API token, newest first.
    pub tokens: Vec<ApiToken>,
}
