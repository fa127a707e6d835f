//! The services' OpenAPI documents, generated with utoipa from the handlers' types, and the
//! route tables their routers are built from, so what a service serves and what its document
//! says can be compared (the system tests do, against the running service).

use axum::Router;
use axum::handler::Handler;
use axum::routing::{MethodFilter, MethodRouter, on};
use utoipa::OpenApi as _;
use utoipa::openapi::OpenApi;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme};

/// The name of the bearer-token security scheme every document declares.
pub const BEARER: &str = "bearer";

/// An HTTP method a route answers (`GET` answers `HEAD` too, as axum does).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    /// `GET`.
    Get,
    /// `POST`.
    Post,
    /// `PATCH`.
    Patch,
    /// `DELETE`.
    Delete,
}

impl Verb {
    /// The method's name, upper case.
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Get => "GET",
            Verb::Post => "POST",
            Verb::Patch => "PATCH",
            Verb::Delete => "DELETE",
        }
    }

    fn filter(self) -> MethodFilter {
        match self {
            Verb::Get => MethodFilter::GET,
            Verb::Post => MethodFilter::POST,
            Verb::Patch => MethodFilter::PATCH,
            Verb::Delete => MethodFilter::DELETE,
        }
    }
}

/// One route of a service: its method, its path (axum's syntax, which OpenAPI shares:
/// `/runs/{runId}`) and the handler that answers it.
pub struct Endpoint<S> {
    /// The method.
    pub verb: Verb,
    /// The path.
    pub path: &'static str,
    handler: MethodRouter<S>,
}

impl<S: Clone + Send + Sync + 'static> Endpoint<S> {
    /// The route `verb path` answered by `handler`.
    pub fn new<H, T>(verb: Verb, path: &'static str, handler: H) -> Self
    where
        H: Handler<T, S>,
        T: 'static,
    {
        Self {
            verb,
            path,
            handler: on(verb.filter(), handler),
        }
    }

    /// The same route with its handler wrapped by `wrap` (a layer of its own).
    pub fn map(self, wrap: impl FnOnce(MethodRouter<S>) -> MethodRouter<S>) -> Self {
        Self {
            handler: wrap(self.handler),
            ..self
        }
    }
}

/// The router of `endpoints`: each on its path, the methods of one path merged.
pub fn router<S: Clone + Send + Sync + 'static>(endpoints: Vec<Endpoint<S>>) -> Router<S> {
    endpoints
        .into_iter()
        .fold(Router::new(), |router, endpoint| {
            router.route(endpoint.path, endpoint.handler)
        })
}

/// The `(method, path)` of each of `endpoints` and of the health routes every service merges
/// in ([`crate::http::HEALTH_PATHS`]): what the service serves.
pub fn served<S>(endpoints: &[Endpoint<S>]) -> Vec<(&'static str, &'static str)> {
    endpoints
        .iter()
        .map(|endpoint| (endpoint.verb.as_str(), endpoint.path))
        .chain(crate::http::HEALTH_PATHS.map(|path| ("GET", path)))
        .collect()
}

/// `doc` completed ([`complete`]) and rendered as JSON: what a service serves at
/// `/openapi.json`, built once per process.
pub fn render(doc: OpenApi) -> String {
    complete(doc).to_json().unwrap_or_default()
}

/// The answer of `GET /openapi.json`: `document` ([`render`]) as `application/json`.
pub fn answer(document: &'static str) -> axum::response::Response {
    use axum::response::IntoResponse as _;
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        document,
    )
        .into_response()
}

/// A service's document completed: the health routes merged in, the bearer scheme declared
/// and required by every operation that does not say otherwise.
pub fn complete(mut doc: OpenApi) -> OpenApi {
    doc.merge(crate::http::HealthApi::openapi());
    let components = doc.components.get_or_insert_with(Default::default);
    components.add_security_scheme(
        BEARER,
        SecurityScheme::Http(
            HttpBuilder::new()
                .scheme(HttpAuthScheme::Bearer)
                .bearer_format("JWT")
                .description(Some(
                    "An HS256 or RS256 JWT: `sub` is the owner, `exp` is required.",
                ))
                .build(),
        ),
    );
    doc.security = Some(vec![SecurityRequirement::new(BEARER, Vec::<String>::new())]);
    doc
}
