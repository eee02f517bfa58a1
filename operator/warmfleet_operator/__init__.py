"""warmfleet operator: reconciles WarmPromptSet resources into daemon pushes (see issue 5)."""
