//! A request's credentials: the token it carries in `X-API-Key` or
//! `Authorization: Bearer`, each header seen at most once. Repeated or
//! disagreeing credentials are refused rather than guessed at (a proxy in
//! front might have added one). Which team the token is, is `tokens`'.

use crate::error::GatewayError;
use http::header::{HeaderMap, HeaderName, HeaderValue, AUTHORIZATION};

/// A typed name: a `&str` name is parsed again on every lookup.
const X_API_KEY: HeaderName = HeaderName::from_static("x-api-key");

/// Whether a request carries anything that may be a team's credential
/// (the overload manager counts a stream without one as anonymous before
/// its handler runs).
pub(crate) fn has_credential(headers: &HeaderMap) -> bool {
    headers.contains_key(&X_API_KEY) || headers.contains_key(AUTHORIZATION)
}

/// The headers that may carry a team's credential, each seen at most once
/// (a repeated one is refused, not guessed at).
#[derive(Clone, Copy, Default)]
pub(crate) struct Credentials<'a> {
    pub(crate) api_key: Once<'a>,
    pub(crate) authorization: Once<'a>,
}

/// A header that may appear once: absent, its one value, or repeated.
#[derive(Clone, Copy, Default)]
pub(crate) enum Once<'a> {
    #[default]
    Absent,
    One(&'a HeaderValue),
    Repeated,
}

impl<'a> Once<'a> {
    /// One more value of the header seen.
    fn see(&mut self, value: &'a HeaderValue) {
        *self = match self {
            Once::Absent => Once::One(value),
            _ => Once::Repeated,
        };
    }

    fn text(self) -> Result<Option<&'a str>, GatewayError> {
        match self {
            Once::Absent => Ok(None),
            Once::Repeated => Err(GatewayError::ConflictingCredentials),
            Once::One(value) => {
                let text = value.to_str().map_err(|_| GatewayError::InvalidCredential)?;
                Ok(Some(text.trim()))
            }
        }
    }
}

impl<'a> Credentials<'a> {
    /// The credential headers of `headers`.
    #[cfg(test)]
    pub(crate) fn of(headers: &'a HeaderMap) -> Credentials<'a> {
        let mut credentials = Credentials::default();
        for (name, value) in headers {
            credentials.see(name, value);
        }
        credentials
    }

    /// Takes one header of a pass over the request's: `true` when it is
    /// a credential header (the one list of them).
    pub(crate) fn see(&mut self, name: &HeaderName, value: &'a HeaderValue) -> bool {
        let header = if *name == X_API_KEY {
            &mut self.api_key
        } else if *name == AUTHORIZATION {
            &mut self.authorization
        } else {
            return false;
        };
        header.see(value);
        true
    }

    /// The one credential of a request. Repeated or disagreeing
    /// credentials are refused rather than guessed at: a proxy in front
    /// might have added one.
    pub(super) fn token(self) -> Result<&'a str, GatewayError> {
        let api_key = self.api_key.text()?;
        let bearer = match self.authorization.text()? {
            Some(value) => bearer_token(value),
            None => None,
        };
        match (api_key, bearer) {
            (Some(a), Some(b)) if a != b => Err(GatewayError::ConflictingCredentials),
            (Some(token), _) | (None, Some(token)) if !token.is_empty() => Ok(token),
            _ => Err(GatewayError::MissingCredential),
        }
    }
}

/// The token of an `Authorization: Bearer <token>` value.
pub(crate) fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bearer_scheme_is_case_blind_and_others_are_not_bearer() {
        assert_eq!(bearer_token("Bearer tok"), Some("tok"));
        assert_eq!(bearer_token("bearer  tok "), Some("tok"));
        assert_eq!(bearer_token("Basic abc"), None);
        assert_eq!(bearer_token("Bearer"), None);
    }
}
