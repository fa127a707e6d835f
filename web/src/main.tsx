import { render } from "preact";

import { Chat } from "./chat";
import { tokenFromFragment } from "./session";
import "./styles.css";
import { App } from "./ui/App";

const chat = new Chat();
render(<App chat={chat} />, document.getElementById("app")!);
// A sign-in link opened in a tab that already shows the client only changes the fragment.
window.addEventListener("hashchange", () => {
  const token = tokenFromFragment();
  if (token) void chat.signIn(token);
});
void chat.start().finally(() => {
  document.documentElement.dataset.ready = "true";
  performance.mark("sb:ready");
});
