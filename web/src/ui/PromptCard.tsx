// A question from the agent (an AG-UI interrupt carrying the prompt of
// websocket-message-schema.md): text, binary_choice, radio, checkbox or dropdown, with the time
// left counting down and the prompt's error once it expires.

import { useEffect, useRef, useState } from "preact/hooks";

import type { ChatItem } from "../chat";
import type { Prompt } from "../types";

interface Props {
  item: ChatItem;
  disabled: boolean;
  onAnswer: (key: string, payload: unknown, label: string | null) => void;
  onExpire: (key: string) => void;
}

function secondsLeft(expiresAt: string | undefined, now: number): number | null {
  if (!expiresAt) return null;
  return Math.max(0, Math.ceil((new Date(expiresAt).getTime() - now) / 1000));
}

function clock(seconds: number): string {
  return `${Math.floor(seconds / 60)}:${String(seconds % 60).padStart(2, "0")}`;
}

export function PromptCard({ item, disabled, onAnswer, onExpire }: Props) {
  const state = item.prompt!;
  const prompt: Prompt = state.interrupt.metadata?.prompt ?? { input_type: "text", text: state.interrupt.message ?? "" };
  const options = prompt.options ?? [];
  const pending = state.status === "pending";
  const [now, setNow] = useState(Date.now());
  const [text, setText] = useState("");
  const [choice, setChoice] = useState<string>("");
  const [checked, setChecked] = useState<string[]>([]);
  const [invalid, setInvalid] = useState<string | null>(null);
  const first = useRef<HTMLElement | null>(null);
  const id = `prompt-${state.interrupt.id.replace(/[^a-zA-Z0-9_-]/g, "")}`;
  const left = secondsLeft(state.interrupt.expiresAt, now);

  useEffect(() => {
    if (!pending || !state.interrupt.expiresAt) return;
    const timer = setInterval(() => setNow(Date.now()), 250);
    return () => clearInterval(timer);
  }, [pending, state.interrupt.expiresAt]);

  useEffect(() => {
    if (pending && left === 0) onExpire(item.key);
  }, [pending, left]);

  const locked = !pending || disabled;

  useEffect(() => {
    // Keyboard users land on the question as soon as it can be answered.
    if (!locked) first.current?.focus();
  }, [locked]);
  const labelOf = (value: string) => options.find((o) => o.value === value)?.label ?? value;

  const submit = (event: Event) => {
    event.preventDefault();
    if (locked) return;
    if (prompt.input_type === "text") {
      if (prompt.required !== false && !text.trim()) return setInvalid("Please type an answer.");
      onAnswer(item.key, text.trim(), text.trim());
    } else if (prompt.input_type === "checkbox") {
      if (prompt.required !== false && checked.length === 0) return setInvalid("Pick at least one option.");
      onAnswer(item.key, checked, checked.map(labelOf).join(", "));
    } else {
      if (!choice) return setInvalid("Pick an option.");
      onAnswer(item.key, choice, labelOf(choice));
    }
    setInvalid(null);
  };

  let body;
  switch (prompt.input_type) {
    case "text":
      body = (
        <div class="field">
          <label for={`${id}-text`}>Your answer</label>
          <input
            id={`${id}-text`}
            ref={(el) => { first.current = el; }}
            type="text"
            value={text}
            placeholder={prompt.placeholder}
            required={prompt.required !== false}
            disabled={locked}
            onInput={(e) => setText((e.target as HTMLInputElement).value)}
          />
        </div>
      );
      break;
    case "binary_choice":
      body = (
        <div class="choice-row">
          {options.map((option, i) => (
            <button
              key={option.id}
              type="button"
              ref={i === 0 ? (el) => { first.current = el; } : undefined}
              class={i === 0 ? "primary" : ""}
              disabled={locked}
              onClick={() => onAnswer(item.key, option.value, option.label)}
            >
              {option.label}
            </button>
          ))}
        </div>
      );
      break;
    case "radio":
    case "checkbox":
      body = (
        <fieldset disabled={locked}>
          <legend class="visually-hidden">{prompt.text}</legend>
          {options.map((option, i) => {
            const inputId = `${id}-${option.id}`;
            const isRadio = prompt.input_type === "radio";
            return (
              <div class="option" key={option.id}>
                <input
                  id={inputId}
                  ref={i === 0 ? (el) => { first.current = el; } : undefined}
                  type={isRadio ? "radio" : "checkbox"}
                  name={id}
                  value={option.value}
                  checked={isRadio ? choice === option.value : checked.includes(option.value)}
                  aria-describedby={option.description ? `${inputId}-d` : undefined}
                  onChange={(e) => {
                    const on = (e.target as HTMLInputElement).checked;
                    if (isRadio) setChoice(option.value);
                    else setChecked(on ? [...checked, option.value] : checked.filter((v) => v !== option.value));
                  }}
                />
                <label for={inputId}>{option.label}</label>
                {option.description && (
                  <span id={`${inputId}-d`} class="option-help">
                    {option.description}
                  </span>
                )}
              </div>
            );
          })}
        </fieldset>
      );
      break;
    case "dropdown":
      body = (
        <div class="field">
          <label for={`${id}-select`}>Choose an option</label>
          <select
            id={`${id}-select`}
            ref={(el) => { first.current = el; }}
            value={choice}
            disabled={locked}
            onChange={(e) => setChoice((e.target as HTMLSelectElement).value)}
          >
            <option value="">Select…</option>
            {options.map((option) => (
              <option key={option.id} value={option.value}>
                {option.label}
              </option>
            ))}
          </select>
        </div>
      );
      break;
  }

  return (
    <form class={`prompt prompt-${state.status}`} aria-labelledby={`${id}-q`} onSubmit={submit} data-input-type={prompt.input_type}>
      <p id={`${id}-q`} class="prompt-question">
        {prompt.text}
      </p>
      {left !== null && pending && (
        <p class="prompt-timer" role="timer" aria-label={`Time left to answer: ${left} seconds`}>
          Time left: <strong>{clock(left)}</strong>
        </p>
      )}
      {body}
      {invalid && pending && (
        <p class="field-error" role="alert">
          {invalid}
        </p>
      )}
      {pending && (
        <div class="prompt-actions">
          {prompt.input_type !== "binary_choice" && (
            <button type="submit" class="primary" disabled={locked}>
              Answer
            </button>
          )}
          <button type="button" class="quiet" disabled={locked} onClick={() => onAnswer(item.key, null, null)}>
            Dismiss
          </button>
        </div>
      )}
      {state.status === "sending" && <p class="prompt-state">Sending your answer…</p>}
      {state.status === "answered" && <p class="prompt-state">You answered: {state.answer}</p>}
      {state.status === "dismissed" && <p class="prompt-state">You dismissed this question.</p>}
      {state.status === "elsewhere" && <p class="prompt-state">Answered in another tab or on another device.</p>}
      {state.status === "timed_out" && (
        <p class="prompt-expired" role="alert">
          {state.error}
        </p>
      )}
      {state.status === "pending" && state.error && (
        <p class="field-error" role="alert">
          {state.error}
        </p>
      )}
    </form>
  );
}
