//! Hostile traffic at the front door (issue 49): tokens outside their window,
//! lifetime or audience are refused over HTTP; behind a trusted proxy each client
//! is limited by its own forwarded address, an untrusted peer's forwarded header is
//! ignored, IPv6 clients share a limit per /64; a buyer's reads have a limit of
//! their own.

use figment::providers::Serialized;
use secrecy::ExposeSecret;
use serde_json::json;

use crate::common::TestEnv;
use crate::front_client::Front;

/// A front stage with `overrides` on the tests' settings, without an engine (the
/// requests here are refused or read).
async fn front_with(
    overrides: impl FnOnce(figment::Figment) -> figment::Figment,
) -> (TestEnv, Front, actix_web::dev::ServerHandle) {
    let env = TestEnv::with(overrides).await;
    let ids = std::sync::Arc::new(seckill_engine::domain::ids::IdGenerator::new(1049));
    let (front, handle) = Front::serve(&env.settings, ids, Default::default()).await;
    (env, front, handle)
}

/// GET of a reservation that does not exist, as `user` with a bearer `token`
/// (`None`: the front client's own token for the user), from `forwarded_for`.
async fn read(front: &Front, token: Option<&str>, forwarded_for: Option<&str>) -> u16 {
    let path = "/v1/reservations/018f0000-0000-7000-8000-000000000000";
    let mut req = match token {
        Some(token) => front
            .client
            .get(format!("{}{path}", front.base))
            .insert_header(("authorization", format!("Bearer {token}"))),
        None => front.request(awc::http::Method::GET, path, Some(7)),
    };
    if let Some(xff) = forwarded_for {
        req = req.insert_header(("x-forwarded-for", xff.to_owned()));
    }
    req.send().await.unwrap().status().as_u16()
}

fn sign(secret: &secrecy::SecretString, claims: serde_json::Value) -> String {
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(secret.expose_secret().as_bytes()),
    )
    .unwrap()
}

#[actix_rt::test]
async fn tokens_outside_their_window_lifetime_or_audience_get_401() {
    let (env, front, handle) = front_with(|f| {
        f.merge(Serialized::default("frontstage.auth.audience", "seckill"))
            .merge(Serialized::default("frontstage.auth.issuer", "login"))
            .merge(Serialized::default("frontstage.auth.leeway_secs", 30))
            .merge(Serialized::default(
                "frontstage.auth.max_lifetime_secs",
                3600,
            ))
    })
    .await;
    let now = chrono::Utc::now().timestamp();
    let claims = |f: &dyn Fn(&mut serde_json::Value)| {
        let mut c = json!({"sub": "7", "aud": "seckill", "iss": "login",
                           "iat": now, "exp": now + 600});
        f(&mut c);
        sign(&front.secret, c)
    };
    // The same token shape passes: what is refused below is refused for its claim.
    assert_eq!(read(&front, Some(&claims(&|_| ())), None).await, 404);
    let refused = [
        ("nbf tomorrow", claims(&|c| c["nbf"] = json!(now + 86_400))),
        (
            "expired beyond the leeway",
            claims(&|c| c["exp"] = json!(now - 31)),
        ),
        (
            "lifetime over the maximum",
            claims(&|c| c["exp"] = json!(now + 7200)),
        ),
        (
            "exp in 2286 without iat",
            claims(&|c| {
                c.as_object_mut().unwrap().remove("iat");
                c["exp"] = json!(9_999_999_999_i64);
            }),
        ),
        (
            "another audience",
            claims(&|c| c["aud"] = json!("elsewhere")),
        ),
        (
            "no audience",
            claims(&|c| {
                c.as_object_mut().unwrap().remove("aud");
            }),
        ),
        ("another issuer", claims(&|c| c["iss"] = json!("evil"))),
    ];
    for (what, token) in refused {
        assert_eq!(read(&front, Some(&token), None).await, 401, "{what}");
    }
    // Within the leeway, expired 20 s ago, still passes.
    assert_eq!(
        read(&front, Some(&claims(&|c| c["exp"] = json!(now - 20))), None).await,
        404
    );
    handle.stop(true).await;
    env.cleanup().await;
}

#[actix_rt::test]
async fn behind_a_trusted_proxy_each_forwarded_client_has_its_own_limit() {
    // The test's requests come from 127.0.0.1, the trusted proxy. Burst 2, then
    // one every 10 s: a third request within the test is limited.
    let (env, front, handle) = front_with(|f| {
        f.merge(Serialized::default(
            "frontstage.auth.trusted_proxies",
            vec!["127.0.0.0/8"],
        ))
        .merge(Serialized::default(
            "frontstage.rate_limit.per_address_per_s",
            1,
        ))
        .merge(Serialized::default(
            "frontstage.rate_limit.per_address_burst",
            2,
        ))
        .merge(Serialized::default(
            "frontstage.rate_limit.per_user_reads_per_s",
            0,
        ))
    })
    .await;
    let a = Some("6.6.6.6, 198.51.100.1");
    assert_eq!(read(&front, None, a).await, 404);
    assert_eq!(read(&front, None, a).await, 404);
    assert_eq!(read(&front, None, a).await, 429, "client A over its burst");
    // Client B behind the same proxy, though A forged B's address on the left.
    let b = Some("198.51.100.1, 198.51.100.2");
    assert_eq!(
        read(&front, None, b).await,
        404,
        "client B has its own limit"
    );
    // Two addresses of one IPv6 /64 are one client; the next /64 is another.
    let v6 = |a: &'static str| Some(a);
    assert_eq!(read(&front, None, v6("2001:db8:0:1::a")).await, 404);
    assert_eq!(read(&front, None, v6("2001:db8:0:1::b")).await, 404);
    assert_eq!(
        read(&front, None, v6("2001:db8:0:1:ffff::c")).await,
        429,
        "same /64"
    );
    assert_eq!(
        read(&front, None, v6("2001:db8:0:2::a")).await,
        404,
        "next /64"
    );
    handle.stop(true).await;
    env.cleanup().await;
}

#[actix_rt::test]
async fn an_untrusted_peer_is_limited_by_its_own_address_whatever_it_forwards() {
    let (env, front, handle) = front_with(|f| {
        f.merge(Serialized::default(
            "frontstage.auth.trusted_proxies",
            vec!["10.0.0.0/8"],
        ))
        .merge(Serialized::default(
            "frontstage.rate_limit.per_address_per_s",
            1,
        ))
        .merge(Serialized::default(
            "frontstage.rate_limit.per_address_burst",
            2,
        ))
        .merge(Serialized::default(
            "frontstage.rate_limit.per_user_reads_per_s",
            0,
        ))
    })
    .await;
    let answers = [
        read(&front, None, Some("198.51.100.1")).await,
        read(&front, None, Some("198.51.100.2")).await,
        read(&front, None, Some("198.51.100.3")).await,
    ];
    assert_eq!(answers, [404, 404, 429], "one peer, one limit");
    handle.stop(true).await;
    env.cleanup().await;
}

#[actix_rt::test]
async fn a_buyer_s_reads_have_a_limit_of_their_own() {
    let (env, front, handle) = front_with(|f| {
        f.merge(Serialized::default(
            "frontstage.rate_limit.per_address_per_s",
            0,
        ))
        .merge(Serialized::default(
            "frontstage.rate_limit.per_user_reads_per_s",
            1,
        ))
        .merge(Serialized::default(
            "frontstage.rate_limit.per_user_reads_burst",
            3,
        ))
    })
    .await;
    let path = "/v1/reservations/018f0000-0000-7000-8000-000000000000";
    let mut statuses = Vec::new();
    for _ in 0..5 {
        statuses.push(front.get(path, Some(7)).await.0);
    }
    assert_eq!(statuses, [404, 404, 404, 429, 429], "user 7's reads");
    let (status, body) = front.get(path, Some(7)).await;
    assert_eq!((status, body["scope"].as_str()), (429, Some("user_reads")));
    // Another buyer reads on.
    assert_eq!(front.get(path, Some(8)).await.0, 404);
    handle.stop(true).await;
    env.cleanup().await;
}
