//! The front stage's HTTP client for tests: each request speaks for the user whose
//! token it presents, and purchase tokens are fetched once and reused, as a client
//! would.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{json, Value};
use uuid::Uuid;

use crate::common::{token, wait_until, HANG};

/// An HTTP client for the front stage under test; each request speaks for the user
/// whose token it presents (`None`: no token).
pub(crate) struct Front {
    pub(crate) client: awc::Client,
    pub(crate) base: String,
    pub(crate) secret: secrecy::SecretString,
    /// Purchase tokens fetched, by (user, activity): reused, as a client would.
    purchase: std::cell::RefCell<HashMap<(i64, i64), String>>,
}

impl Front {
    /// Starts a front stage with `settings` (its own pool, `ids`, reporting to
    /// `readiness`) on the test's runtime; the handle stops it.
    pub(crate) async fn serve(
        settings: &seckill_engine::config::Settings,
        ids: std::sync::Arc<seckill_engine::domain::ids::IdGenerator>,
        readiness: std::sync::Arc<seckill_engine::status::Readiness>,
    ) -> (Self, actix_web::dev::ServerHandle) {
        let pool = seckill_engine::store::build_pool(&settings.database).unwrap();
        let running = seckill_engine::http::front::start(settings, pool, ids, readiness)
            .await
            .unwrap();
        let handle = running.server.handle();
        actix_rt::spawn(running.server);
        (Self::new(running.addr, settings), handle)
    }

    pub(crate) fn new(
        addr: std::net::SocketAddr,
        settings: &seckill_engine::config::Settings,
    ) -> Self {
        // A pooled connection is reused only well within the front stage's
        // keep-alive (`frontstage.limits.keep_alive_ms`): awc's default of 15 s
        // would hand out a connection the server closed at 5 s, and the request on
        // it fails with `Disconnected` (seen under a loaded CI run).
        let keep_alive = Duration::from_millis(settings.frontstage.limits.keep_alive_ms / 2);
        let connector = awc::Connector::new().conn_keep_alive(keep_alive);
        Self {
            client: awc::Client::builder().connector(connector).finish(),
            base: format!("http://{addr}"),
            secret: settings
                .frontstage
                .auth
                .hs256_secret
                .clone()
                .expect("the tests' settings carry a JWT secret"),
            purchase: Default::default(),
        }
    }

    /// `user`'s purchase token for SKU 1 of `activity`, fetched once.
    pub(crate) async fn purchase_token(&self, activity: i64, user: i64) -> String {
        if let Some(token) = self.purchase.borrow().get(&(user, activity)) {
            return token.clone();
        }
        let (status, body) = self
            .get(
                &format!("/v1/activities/{activity}/skus/1/purchase-token"),
                Some(user),
            )
            .await;
        assert_eq!(status, 200, "purchase token: {body}");
        let token = body["token"].as_str().unwrap().to_owned();
        self.purchase
            .borrow_mut()
            .insert((user, activity), token.clone());
        token
    }

    /// POSTs a reservation with whatever purchase token is given.
    pub(crate) async fn reserve_with(
        &self,
        activity: i64,
        user: i64,
        request: Uuid,
        purchase: Option<&str>,
    ) -> (u16, Value) {
        let mut req = self
            .request(
                awc::http::Method::POST,
                &format!("/v1/activities/{activity}/skus/1/reservations"),
                Some(user),
            )
            .insert_header(("content-type", "application/json"));
        if let Some(purchase) = purchase {
            req = req.insert_header(("x-purchase-token", purchase.to_owned()));
        }
        let mut res = req
            .send_body(json!({"request_id": request}).to_string())
            .await
            .unwrap();
        let bytes = res.body().await.unwrap();
        (
            res.status().as_u16(),
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }

    pub(crate) fn request(
        &self,
        method: awc::http::Method,
        path: &str,
        user: Option<i64>,
    ) -> awc::ClientRequest {
        let mut req = self.client.request(method, format!("{}{path}", self.base));
        if let Some(user) = user {
            req = req.insert_header((
                "authorization",
                format!("Bearer {}", token(&self.secret, user)),
            ));
        }
        req
    }

    pub(crate) async fn post(&self, path: &str, body: &str, user: Option<i64>) -> (u16, Value) {
        let mut res = self
            .request(awc::http::Method::POST, path, user)
            .insert_header(("content-type", "application/json"))
            .send_body(body.to_owned())
            .await
            .unwrap();
        let bytes = res.body().await.unwrap();
        (
            res.status().as_u16(),
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }

    pub(crate) async fn get(&self, path: &str, user: Option<i64>) -> (u16, Value) {
        let mut res = self
            .request(awc::http::Method::GET, path, user)
            .send()
            .await
            .unwrap();
        let bytes = res.body().await.unwrap();
        (
            res.status().as_u16(),
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }

    /// Waits (`HANG` at most) until `user`'s reservation reads `status`.
    pub(crate) async fn reaches(&self, reservation: &str, status: &str, user: i64) -> bool {
        let path = format!("/v1/reservations/{reservation}");
        wait_until(HANG, || async {
            self.get(&path, Some(user)).await.1["status"] == status
        })
        .await
    }

    /// A reservation as a client makes it: with its purchase token.
    pub(crate) async fn reserve(&self, activity: i64, user: i64, request: Uuid) -> (u16, Value) {
        let purchase = if self.activity_exists(activity) {
            Some(self.purchase_token(activity, user).await)
        } else {
            None
        };
        self.reserve_with(activity, user, request, purchase.as_deref())
            .await
    }

    /// Activity 999 is the tests' unknown one (no token can be fetched for it).
    pub(crate) fn activity_exists(&self, activity: i64) -> bool {
        activity != 999
    }
}
