"""The paper's design claims reproduced in miniature; see the README section
"The paper's design claims, in miniature". Run each script from the repository root."""
