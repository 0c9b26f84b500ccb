//! Bearer tokens for many tenants, picked per request with the seed's skew. The lab mints
//! HS256 tokens with the shared secret, or reads them from a JSON-lines file.

use std::path::Path;

use http::HeaderValue;
use jsonwebtoken::{EncodingKey, Header, encode};
use rand::Rng;
use rand::distr::Distribution;
use rand::distr::weighted::WeightedIndex;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// The API's development secret (`JWT_SECRET`'s default); never a production one.
pub const DEV_SECRET: &str = "breakwater-dev-secret-change-me";

/// How long minted tokens live: longer than any run.
const TTL_SECS: i64 = 24 * 3600;

#[derive(Debug, Clone)]
pub struct Tenant {
    pub tenant_id: String,
    pub user_id: String,
    pub weight: f64,
    /// `Bearer <jwt>`, ready to send.
    pub authorization: HeaderValue,
}

/// One line of a tokens file. Without `token`, one is minted with the secret.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TokenLine {
    pub tenant_id: String,
    pub user_id: String,
    #[serde(default)]
    pub token: Option<String>,
    #[serde(default = "one")]
    pub weight: f64,
}

fn one() -> f64 {
    1.0
}

#[derive(Debug, Serialize)]
struct Claims<'a> {
    tenant_id: &'a str,
    sub: &'a str,
    role: &'a str,
    exp: i64,
}

/// Mints an HS256 token with the API's claims.
pub fn mint(secret: &str, tenant_id: &str, user_id: &str, role: &str) -> anyhow::Result<String> {
    let exp = chrono::Utc::now().timestamp() + TTL_SECS;
    let claims = Claims { tenant_id, sub: user_id, role, exp };
    Ok(encode(&Header::default(), &claims, &EncodingKey::from_secret(secret.as_bytes()))?)
}

/// The tenants of a run, with a weighted picker.
#[derive(Debug, Clone, Default)]
pub struct Tokens {
    tenants: Vec<Tenant>,
    dist: Option<WeightedIndex<f64>>,
}

impl Tokens {
    /// No authentication (for plain URLs).
    pub fn none() -> Self {
        Self::default()
    }

    pub fn from_lines(lines: Vec<TokenLine>, secret: &str) -> anyhow::Result<Self> {
        let mut tenants = Vec::with_capacity(lines.len());
        for l in lines {
            let token = match l.token {
                Some(t) => t,
                None => mint(secret, &l.tenant_id, &l.user_id, "agent")?,
            };
            let authorization = HeaderValue::from_str(&format!("Bearer {token}"))?;
            tenants.push(Tenant { tenant_id: l.tenant_id, user_id: l.user_id, weight: l.weight, authorization });
        }
        let dist = if tenants.is_empty() {
            None
        } else {
            Some(WeightedIndex::new(tenants.iter().map(|t| t.weight.max(0.0)))?)
        };
        Ok(Self { tenants, dist })
    }

    /// Reads a JSON-lines file of `{"tenant_id","user_id","token","weight"}`.
    pub fn from_file(path: &Path, secret: &str) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("cannot read tokens file {}: {e}", path.display()))?;
        let mut lines = Vec::new();
        for (n, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let l: TokenLine =
                serde_json::from_str(line).map_err(|e| anyhow::anyhow!("{}:{}: {e}", path.display(), n + 1))?;
            lines.push(l);
        }
        Self::from_lines(lines, secret)
    }

    /// `n` synthetic tenants skewed like the seed: the first holds 55% of the traffic, the
    /// rest share 45% evenly. For servers that do not look tenants up (tests, echo servers).
    pub fn synthetic(n: usize, secret: &str, seed: u64) -> anyhow::Result<Self> {
        let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(seed);
        let lines = (0..n)
            .map(|i| TokenLine {
                tenant_id: Uuid::from_u128(rng.random()).to_string(),
                user_id: Uuid::from_u128(rng.random()).to_string(),
                token: None,
                weight: if n == 1 {
                    1.0
                } else if i == 0 {
                    0.55
                } else {
                    0.45 / (n - 1) as f64
                },
            })
            .collect();
        Self::from_lines(lines, secret)
    }

    pub fn is_empty(&self) -> bool {
        self.tenants.is_empty()
    }

    pub fn tenants(&self) -> &[Tenant] {
        &self.tenants
    }

    /// A tenant picked by weight, with its index.
    pub fn pick<R: Rng + ?Sized>(&self, rng: &mut R) -> Option<(usize, &Tenant)> {
        let i = self.dist.as_ref()?.sample(rng);
        self.tenants.get(i).map(|t| (i, t))
    }

    /// The heaviest tenant (the smoke stage runs as it).
    pub fn heaviest(&self) -> Option<(usize, &Tenant)> {
        self.tenants.iter().enumerate().max_by(|a, b| a.1.weight.total_cmp(&b.1.weight))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn minted_tokens_carry_the_api_claims() -> anyhow::Result<()> {
        let t = mint(DEV_SECRET, "t-1", "u-1", "agent")?;
        let mut v = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::HS256);
        v.set_required_spec_claims(&["exp"]);
        let data = jsonwebtoken::decode::<serde_json::Value>(
            &t,
            &jsonwebtoken::DecodingKey::from_secret(DEV_SECRET.as_bytes()),
            &v,
        )?;
        assert_eq!(data.claims["tenant_id"], "t-1");
        assert_eq!(data.claims["sub"], "u-1");
        assert_eq!(data.claims["role"], "agent");
        Ok(())
    }

    #[test]
    fn picks_follow_the_seed_skew() -> anyhow::Result<()> {
        let tokens = Tokens::synthetic(10, DEV_SECRET, 1)?;
        let mut rng = rand::rngs::SmallRng::seed_from_u64(9);
        let heavy = (0..10_000).filter(|_| tokens.pick(&mut rng).map(|p| p.0) == Some(0)).count();
        assert!((5_200..5_800).contains(&heavy), "{heavy}");
        Ok(())
    }
}
