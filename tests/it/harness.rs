//! The harness itself works: a real redis-server round trip, killed and restarted.

use crate::support::redis::RedisServer;
use redis::AsyncCommands;

#[tokio::test]
async fn redis_round_trip_against_spawned_server() {
    let server = RedisServer::start();
    let client = redis::Client::open(server.url()).expect("redis url parses");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connects to spawned redis");
    let _: () = conn.set("harness:key", "value").await.expect("SET");
    let got: String = conn.get("harness:key").await.expect("GET");
    assert_eq!(got, "value");
}

#[tokio::test]
async fn redis_can_be_killed_and_restarted_mid_test() {
    let mut server = RedisServer::start();
    let client = redis::Client::open(server.url()).expect("redis url parses");
    server.kill();
    assert!(
        client.get_multiplexed_async_connection().await.is_err(),
        "a killed server must refuse connections"
    );
    server.restart();
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("reconnects after restart");
    let pong: String = redis::cmd("PING").query_async(&mut conn).await.expect("PING");
    assert_eq!(pong, "PONG");
}
