//! Who is asking: the signed-in person or the API token's owner, and what their role lets them do. The
//! server resolves the caller of every request; server functions check the role they need here, on the
//! server, whatever the browser shows or hides.

use serde::{Deserialize, Serialize};

/// What an account may do. Each role can do what the ones below it can.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Reads everything, changes nothing.
    Viewer,
    /// Deploys, changes shares and serving configurations, removes.
    Operator,
    /// Also manages accounts and API tokens.
    Admin,
}

impl Role {
    /// Every role, most able last.
    pub const ALL: [Role; 3] = [Role::Viewer, Role::Operator, Role::Admin];

    /// Its name in forms, the API and the database.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
            Role::Admin => "admin",
        }
    }

    /// Its name after "is", as a sentence says it: "an operator".
    pub fn with_article(self) -> &'static str {
        match self {
            Role::Viewer => "a viewer",
            Role::Operator => "an operator",
            Role::Admin => "an admin",
        }
    }

    /// The role named `name`.
    pub fn parse(name: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|r| r.as_str() == name)
    }

    /// Whether this role may do what `needed` may.
    pub fn allows(self, needed: Role) -> bool {
        self >= needed
    }
}

/// The caller of a request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Caller {
    /// The account's name.
    pub name: String,
    /// Its role.
    pub role: Role,
}

/// The CSRF token of the caller's browser session, which the server puts beside the caller so that the page
/// can carry it into every change it sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CsrfToken(pub String);

/// The header a change from the browser carries its CSRF token in.
pub const CSRF_HEADER: &str = "x-csrf-token";

#[cfg(feature = "ssr")]
mod ssr {
    use super::{Caller, CsrfToken, Role};
    use crate::error::AppError;
    use leptos::prelude::use_context;

    /// The caller of this request, as the server resolved it.
    pub fn caller() -> Option<Caller> {
        use_context::<http::request::Parts>()?
            .extensions
            .get::<Caller>()
            .cloned()
    }

    /// The caller, if their role allows `needed`: 401 without one, 403 when the role falls short.
    pub fn require(needed: Role) -> Result<Caller, AppError> {
        let refused = |e: AppError| {
            if let Some(options) = use_context::<leptos_axum::ResponseOptions>() {
                options.set_status(
                    http::StatusCode::from_u16(e.status()).unwrap_or(http::StatusCode::FORBIDDEN),
                );
            }
            e
        };
        let caller = caller()
            .ok_or_else(|| refused(AppError::Unauthorized("Sign in to do this.".to_owned())))?;
        if caller.role.allows(needed) {
            Ok(caller)
        } else {
            Err(refused(AppError::Forbidden(format!(
                "{} is {}: this needs the {} role.",
                caller.name,
                caller.role.with_article(),
                needed.as_str()
            ))))
        }
    }

    /// The CSRF token of this request's browser session.
    pub fn csrf_token() -> Option<String> {
        use_context::<http::request::Parts>()?
            .extensions
            .get::<CsrfToken>()
            .map(|t| t.0.clone())
    }
}

#[cfg(feature = "ssr")]
pub use ssr::{caller, csrf_token, require};

/// This page's CSRF token, for the forms that post to the server (sign in, set up, sign out): on the
/// server the session's, in the browser what the server rendered into the page, so both render alike.
pub fn page_csrf() -> String {
    #[cfg(feature = "ssr")]
    {
        csrf_token().unwrap_or_default()
    }
    #[cfg(not(feature = "ssr"))]
    {
        rendered_csrf().unwrap_or_default()
    }
}

/// The token the server rendered into this page's `<meta name="csrf-token">`.
#[cfg(not(feature = "ssr"))]
pub fn rendered_csrf() -> Option<String> {
    #[cfg(feature = "hydrate")]
    {
        web_sys::window()?
            .document()?
            .query_selector(r#"meta[name="csrf-token"]"#)
            .ok()??
            .get_attribute("content")
    }
    #[cfg(not(feature = "hydrate"))]
    {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::Role;

    #[test]
    fn each_role_can_do_what_the_ones_below_it_can() {
        assert!(Role::Admin.allows(Role::Operator));
        assert!(Role::Operator.allows(Role::Viewer));
        assert!(!Role::Viewer.allows(Role::Operator));
        assert!(!Role::Operator.allows(Role::Admin));
        for role in Role::ALL {
            assert_eq!(Role::parse(role.as_str()), Some(role));
        }
        assert_eq!(Role::parse("root"), None);
    }
}
