import { useState } from "preact/hooks";

export function SignIn({ error, onSignIn }: { error: string | null; onSignIn: (token: string) => Promise<boolean> }) {
  const [token, setToken] = useState("");
  const [busy, setBusy] = useState(false);
  return (
    <main class="signin" id="main">
      <form
        class="signin-card"
        aria-labelledby="signin-title"
        onSubmit={async (e) => {
          e.preventDefault();
          setBusy(true);
          await onSignIn(token);
          setBusy(false);
        }}
      >
        <h1 id="signin-title">Sign in to Switchboard</h1>
        <p>
          Open the sign-in link <code>scripts/up.sh</code> printed, or paste a bearer token (
          <code>scripts/token.sh alice</code>). It is kept for this tab only.
        </p>
        <label for="token">Bearer token</label>
        <textarea id="token" rows={4} value={token} required spellcheck={false} autoComplete="off" onInput={(e) => setToken((e.target as HTMLTextAreaElement).value)} />
        {error && (
          <p class="field-error" role="alert">
            {error}
          </p>
        )}
        <button type="submit" class="primary" disabled={busy || !token.trim()}>
          {busy ? "Signing in…" : "Sign in"}
        </button>
      </form>
    </main>
  );
}
